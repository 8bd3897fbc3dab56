//! Python tool venvs for the tests that drive Python tools (the contract
//! test's schemathesis, the Python client's pytest): one venv per test under
//! the target dir, with pinned packages, made on first use and reused while
//! its pins and interpreter stay the same. Where it cannot be made the test
//! is skipped with a message, unless its `MUSTER_REQUIRE_*` variable is 1
//! (CI), where it fails.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// What one test needs from Python.
pub struct PyTools {
    /// The test, as messages name it ("the contract test").
    pub test: &'static str,
    /// `MUSTER_REQUIRE_…`: 1 turns a skip into a failure.
    pub require_var: &'static str,
    /// `MUSTER_…_PYTHON`: the interpreter to use, overriding the search.
    pub python_var: &'static str,
    /// The venv's directory name under the target dir.
    pub dir: &'static str,
    /// Python 3.x with x at least this is preferred...
    pub prefer_minor: u32,
    /// ...and below this refused.
    pub min_minor: u32,
    /// The packages, pinned (`name==version`).
    pub pins: &'static [&'static str],
}

/// Its stdout and stderr, as text.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn is_at_least(python: &str, minor: u32) -> bool {
    Command::new(python)
        .args(["-c", &format!("import sys; sys.exit(sys.version_info < (3, {minor}))")])
        .output()
        .is_ok_and(|o| o.status.success())
}

impl PyTools {
    pub fn required(&self) -> bool {
        std::env::var(self.require_var).is_ok_and(|v| v == "1")
    }

    /// Says why the test cannot run: a failure when required, a skip
    /// elsewhere.
    pub fn unavailable(&self, why: &str) -> Option<PathBuf> {
        if self.required() {
            panic!("{} needs Python and PyPI ({}=1): {why}", self.test, self.require_var);
        }
        eprintln!("SKIPPED {}: {why}", self.test);
        None
    }

    /// The interpreter: the override variable, else the first of
    /// python3.13, python3.12, pyenv's versions (newest first; their shims
    /// do not work) and python3 that is at least 3.`prefer_minor`, else
    /// python3 when it is at least 3.`min_minor`.
    pub fn python(&self) -> Option<String> {
        if let Ok(p) = std::env::var(self.python_var) {
            return Some(p);
        }
        let mut candidates: Vec<String> = vec!["python3.13".into(), "python3.12".into()];
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
        candidates.push("python3".into());
        candidates
            .into_iter()
            .find(|p| is_at_least(p, self.prefer_minor))
            .or_else(|| is_at_least("python3", self.min_minor).then(|| "python3".to_string()))
    }

    /// The venv with the pinned packages, made on first use (one test
    /// process at a time, under a file lock); None (after saying why) when
    /// it cannot be made and the test is not required.
    pub fn venv(&self) -> Option<PathBuf> {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target dir")
            .to_path_buf();
        let dir = target.join(self.dir);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target.join(format!("{}.lock", self.dir)))
            .expect("the venv lock file");
        // SAFETY: flock on a file descriptor we own; released when `lock` drops.
        assert_eq!(
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) },
            0,
            "lock the venv"
        );
        let Some(python) = self.python() else {
            return self.unavailable(&format!(
                "no Python 3.{}+ found (set {})",
                self.min_minor, self.python_var
            ));
        };
        let marker = dir.join(".muster-pins");
        let pins = format!("{} with {python}", self.pins.join(" "));
        if std::fs::read_to_string(&marker).is_ok_and(|p| p == pins) {
            return Some(dir);
        }
        let _ = std::fs::remove_dir_all(&dir);
        match Command::new(&python).args(["-m", "venv"]).arg(&dir).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => return self.unavailable(&format!("{python} -m venv failed: {}", output_text(&o))),
            Err(e) => return self.unavailable(&format!("{python} does not run ({e})")),
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
            .args(self.pins)
            .output()
            .expect("pip runs");
        if !pip.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return self.unavailable(&format!(
                "pip could not install {pins} (is PyPI reachable?): {}",
                output_text(&pip)
            ));
        }
        std::fs::write(&marker, &pins).unwrap();
        eprintln!("made {} in {:?}", dir.display(), started.elapsed());
        Some(dir)
    }
}
