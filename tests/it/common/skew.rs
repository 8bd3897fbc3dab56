//! A Redis server whose clock runs ahead (or behind) by a fixed offset: an
//! `LD_PRELOAD` shim that shifts `CLOCK_REALTIME` (`clock_gettime`,
//! `gettimeofday`, `time`), compiled once per test process with the
//! machine's C compiler. Monotonic clocks are left alone.
//!
//! libfaketime cannot do this here: redis-server is linked with jemalloc,
//! whose first allocation reads the clock while libfaketime initialises
//! (it loops and gives up). The shim reads the clock with the raw system
//! call and allocates nothing, so it cannot recurse.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <unistd.h>

static long long offset_ns(void) {
    static int ready = 0;
    static long long off = 0;
    if (!ready) {
        const char *s = getenv("MUSTER_TEST_CLOCK_SKEW_MS");
        off = s ? atoll(s) * 1000000LL : 0;
        ready = 1;
    }
    return off;
}

static int shifted(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
        ts->tv_sec = (time_t)(ns / 1000000000LL);
        ts->tv_nsec = (long)(ns % 1000000000LL);
    }
    return r;
}

int clock_gettime(clockid_t clk, struct timespec *ts) { return shifted(clk, ts); }

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = shifted(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    shifted(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// The compiled shim (built once, kept for the test process's life).
fn shim() -> &'static PathBuf {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("muster-skew-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("skew.c");
        let so = dir.join("libskew.so");
        std::fs::write(&src, SHIM).unwrap();
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&so)
            .arg(&src)
            .output()
            .expect("a C compiler (cc) builds the clock-skew shim");
        assert!(
            out.status.success(),
            "cc could not build the clock-skew shim:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        so
    })
}

/// The environment that runs a process with its wall clock `ms` ahead
/// (negative: behind).
pub fn env(ms: i64) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), shim().to_string_lossy().into_owned()),
        ("MUSTER_TEST_CLOCK_SKEW_MS".into(), ms.to_string()),
    ]
}
