//! The Python client (`clients/python`) against the real binary: its own
//! pytest suite, which starts a redis-server and two `muster` processes
//! (MUSTER_BIN is the binary cargo built) and proves the worker's
//! guarantees (1 000 tasks across node kills, a killed worker's task
//! recovered, SIGTERM drains, a stale token cancels the handler), then
//! `mypy --strict` on the package and its tests.
//!
//! The tools live in a venv under `<target>/pyclient-venv`, made once with
//! pinned versions (a file lock keeps parallel test processes from building
//! it twice); the package itself is reinstalled from the checkout on every
//! run (no build isolation: offline once the venv exists). Without Python
//! 3.10+ or PyPI the test says so and passes; `.ci/run` sets
//! MUSTER_REQUIRE_PYCLIENT=1, which makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::common::venv::{self, output_text};
use crate::common::*;

/// The pinned tools and the package's dependencies, as checked.
const PINS: &[&str] = &[
    "httpx==0.28.1",
    "websockets==15.0.1",
    "pytest==8.4.2",
    "mypy==1.18.2",
    "setuptools==80.9.0",
];

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python")
}

const TOOLS: venv::PyTools = venv::PyTools {
    test: "the Python client test",
    require_var: "MUSTER_REQUIRE_PYCLIENT",
    python_var: "MUSTER_PYCLIENT_PYTHON",
    dir: "pyclient-venv",
    prefer_minor: 10,
    min_minor: 10,
    pins: PINS,
};

fn venv() -> Option<PathBuf> {
    TOOLS.venv()
}

/// Runs a tool of the venv in the package's directory, without writing
/// caches into the checkout.
fn run(venv: &Path, tool: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(venv.join("bin").join(tool))
        .args(args)
        .current_dir(package_dir())
        .env("MUSTER_BIN", muster_bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("{tool} runs: {e}"));
    (out.status.success(), output_text(&out))
}

#[test]
fn the_python_client_passes_its_suite_against_real_nodes() {
    let Some(venv) = venv() else { return };
    // The package as users get it: a real (non-editable) install with its
    // test extras, from the checkout; every dependency is already pinned.
    let pkg = format!("{}[test]", package_dir().display());
    let (ok, out) = run(
        &venv,
        "pip",
        &[
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-build-isolation",
            "--no-index",
            "--force-reinstall",
            "--no-deps",
            &pkg,
        ],
    );
    assert!(ok, "pip could not install clients/python:\n{out}");
    let started = Instant::now();
    let (ok, out) = run(&venv, "pytest", &["-q", "-p", "no:cacheprovider", "tests"]);
    eprintln!("pytest in {:?}:\n{out}", started.elapsed());
    assert!(ok, "the Python client's tests failed:\n{out}");

    let cache = venv.join("mypy-cache");
    let (ok, out) = run(
        &venv,
        "mypy",
        &["--strict", "--cache-dir", cache.to_str().unwrap(), "src", "tests"],
    );
    assert!(ok, "mypy --strict finds errors in clients/python:\n{out}");
}
