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

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

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

fn required() -> bool {
    std::env::var("MUSTER_REQUIRE_PYCLIENT").is_ok_and(|v| v == "1")
}

/// Says why the test cannot run: a failure in CI, a skip elsewhere.
fn unavailable(why: &str) -> Option<PathBuf> {
    if required() {
        panic!("the Python client test needs Python and PyPI (MUSTER_REQUIRE_PYCLIENT=1): {why}");
    }
    eprintln!("SKIPPED the Python client test: {why}");
    None
}

/// MUSTER_PYCLIENT_PYTHON, else `python3` when it is 3.10 or newer, else
/// the newest pyenv version that is.
fn python() -> Option<String> {
    if let Ok(p) = std::env::var("MUSTER_PYCLIENT_PYTHON") {
        return Some(p);
    }
    let recent = |p: &str| {
        Command::new(p)
            .args(["-c", "import sys; sys.exit(sys.version_info < (3, 10))"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut candidates = vec!["python3".to_string()];
    if let Some(home) = std::env::var_os("HOME") {
        let mut found: Vec<PathBuf> = std::fs::read_dir(Path::new(&home).join(".pyenv/versions"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin/python3"))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev().map(|p| p.display().to_string()));
    }
    candidates.into_iter().find(|p| recent(p))
}

fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The venv with the pinned tools, made on first use; None (after saying
/// why) when it cannot be made and the test is not required.
fn venv() -> Option<PathBuf> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .to_path_buf();
    let dir = target.join("pyclient-venv");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target.join("pyclient-venv.lock"))
        .expect("the venv lock file");
    // SAFETY: flock on a file descriptor we own; released when `lock` drops.
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) },
        0,
        "lock the venv"
    );
    let Some(python) = python() else {
        return unavailable("no Python 3.10+ found (set MUSTER_PYCLIENT_PYTHON)");
    };
    match Command::new(&python).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return unavailable(&format!("{python} --version failed: {}", output_text(&o))),
        Err(e) => return unavailable(&format!("{python} does not run ({e})")),
    }
    let marker = dir.join(".muster-pins");
    let pins = format!("{} with {python}", PINS.join(" "));
    if std::fs::read_to_string(&marker).is_ok_and(|p| p == pins) {
        return Some(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    match Command::new(&python).args(["-m", "venv"]).arg(&dir).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return unavailable(&format!("{python} -m venv failed: {}", output_text(&o))),
        Err(e) => return unavailable(&format!("{python} -m venv does not run ({e})")),
    }
    let started = Instant::now();
    let pip = Command::new(dir.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--timeout",
            "20",
            "--retries",
            "1",
        ])
        .args(PINS)
        .output()
        .expect("pip runs");
    if !pip.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return unavailable(&format!(
            "pip could not install {pins} (is PyPI reachable?): {}",
            output_text(&pip)
        ));
    }
    std::fs::write(&marker, &pins).unwrap();
    eprintln!("made {} in {:?}", dir.display(), started.elapsed());
    Some(dir)
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
