//! Lua scripts: one file per atomic state change, loaded through [`Lua`].
//!
//! A script is sent as one chunk: the shared prelude (`lua/prelude.lua`: the
//! namespace prefix, the deadline check of G12, Redis time, the error-code
//! table `E` of [`codes`](super::codes), the event emitter), then the
//! libraries it includes, then its own file. A script or library names what
//! it needs on header lines `--@include <library>`; they are resolved depth
//! first, each library once, before the file that names them (see
//! [`LIBRARIES`]). The prefix, the stream bound and the code table are
//! substituted into the text once, at start, so the scripts need no extra
//! arguments for them; the SHA differs per namespace, which is harmless.
//! redis-rs sends EVALSHA and loads the script on NOSCRIPT, so a Redis
//! restart or failover needs no special handling.

/// Values substituted into every script.
#[derive(Debug, Clone)]
pub struct ScriptCtx {
    /// The hash-tagged prefix, `{muster}`.
    pub prefix: String,
    pub events_max_len: u64,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// Every library a script may include, by the name it is included as.
/// `tasks/lib` carries the workflow hook with it: every terminal transition
/// of a task advances its workflow in the same script (`wf_on_end`).
pub const LIBRARIES: &[(&str, &str)] = &[
    ("nodes/liveness", include_str!("../nodes/lua/liveness.lua")),
    (
        "tasks/lib",
        concat!(
            include_str!("../tasks/lua/lib.lua"),
            "\n",
            include_str!("../workflows/lua/hook.lua")
        ),
    ),
    ("orphans/lib", include_str!("../orphans/lua/lib.lua")),
    ("locks/lib", include_str!("../locks/lua/lib.lua")),
    ("barriers/lib", include_str!("../barriers/lua/lib.lua")),
    ("schedules/lib", include_str!("../schedules/lua/lib.lua")),
];

/// The libraries a source names on its `--@include` lines, in order.
fn includes(source: &str) -> impl Iterator<Item = &str> {
    source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("--@include "))
        .map(str::trim)
}

fn library(name: &str) -> Option<&'static str> {
    LIBRARIES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Appends `source`'s includes (depth first, each once) to `out`. Errs on
/// a library that does not exist.
fn resolve(source: &str, out: &mut String, seen: &mut Vec<String>) -> Result<(), String> {
    for name in includes(source) {
        if seen.iter().any(|s| s == name) {
            continue;
        }
        seen.push(name.to_string());
        let lib = library(name).ok_or_else(|| format!("unknown library `{name}`"))?;
        resolve(lib, out, seen)?;
        out.push_str(&format!("\n-- library: {name}\n"));
        out.push_str(lib);
    }
    Ok(())
}

/// The full text sent for a script.
pub fn assemble(name: &str, source: &str, ctx: &ScriptCtx) -> Result<String, String> {
    let mut code = PRELUDE
        .replace("__PREFIX__", &ctx.prefix)
        .replace("__EVENTS_MAXLEN__", &ctx.events_max_len.to_string())
        .replace("__CODES__", &super::codes::lua_table());
    let mut seen = Vec::new();
    resolve(source, &mut code, &mut seen).map_err(|e| format!("script {name}: {e}"))?;
    code.push_str(&format!("\n-- script: {name}\n{source}"));
    Ok(code)
}

/// One call of a script: its keys and arguments in the order its header
/// documents, and the type its reply decodes into. Each subsystem's
/// `scripts.rs` has one such struct per script, beside the Lua header it
/// mirrors; [`Store::run`](super::Store::run) sends it.
pub trait ScriptCall {
    type Reply: redis::FromRedisValue;
    /// The keys, built from the namespace's key builder.
    fn keys(&self, keys: &super::Keys) -> Vec<String>;
    /// The arguments (the deadline is appended by the store).
    fn args(&self) -> Vec<String>;
}

/// A loaded-on-demand script with a name for metrics and logs.
#[derive(Debug, Clone)]
pub struct Lua {
    name: &'static str,
    script: redis::Script,
}

impl Lua {
    /// Script `name` with the includes its source declares. The sources are
    /// compiled in, so an unknown include is a bug caught by the unit test
    /// that assembles every script; it panics at start, never later.
    pub fn load(name: &'static str, source: &str, ctx: &ScriptCtx) -> Self {
        let code = assemble(name, source, ctx).unwrap_or_else(|e| panic!("{e}"));
        Lua {
            name,
            script: redis::Script::new(&code),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn script(&self) -> &redis::Script {
        &self.script
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ScriptCtx {
        ScriptCtx {
            prefix: "{muster}".into(),
            events_max_len: 100_000,
        }
    }

    /// Every script file under `src/*/lua/` (not the prelude, not a library).
    pub(crate) fn all_scripts() -> Vec<(String, String)> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = Vec::new();
        for sub in std::fs::read_dir(&src).unwrap() {
            let lua = sub.unwrap().path().join("lua");
            let Ok(files) = std::fs::read_dir(&lua) else { continue };
            for f in files {
                let path = f.unwrap().path();
                let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace("/lua/", "/");
                let rel = rel.trim_end_matches(".lua").to_string();
                let is_lib = LIBRARIES
                    .iter()
                    .any(|(n, _)| rel == *n || (*n == "tasks/lib" && rel == "workflows/hook"));
                if is_lib || rel == "store/prelude" {
                    continue;
                }
                out.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn every_script_assembles_with_its_includes_once_each() {
        let scripts = all_scripts();
        assert!(scripts.len() > 40, "{}", scripts.len());
        for (name, source) in &scripts {
            let code = assemble(name, source, &ctx()).unwrap();
            for (lib, _) in LIBRARIES {
                let n = code.matches(&format!("-- library: {lib}\n")).count();
                assert!(n <= 1, "{name} includes {lib} {n} times");
            }
            assert!(!code.contains("__PREFIX__") && !code.contains("__CODES__"), "{name}");
            if let Ok(dir) = std::env::var("MUSTER_DUMP_SCRIPTS") {
                let path = std::path::Path::new(&dir).join(format!("{}.lua", name.replace('/', "_")));
                std::fs::write(path, &code).unwrap();
            }
        }
        assert!(assemble("x", "--@include nope/lib\nreturn 1", &ctx()).is_err());
    }

    #[test]
    fn libraries_come_before_the_files_that_include_them() {
        let code = assemble("orphans/recover", "--@include orphans/lib\nreturn 1", &ctx()).unwrap();
        let at = |s: &str| code.find(s).unwrap();
        assert!(at("-- library: nodes/liveness") < at("-- library: orphans/lib"));
        assert!(at("-- library: tasks/lib") < at("-- library: orphans/lib"));
        assert!(at("-- library: orphans/lib") < at("-- script: orphans/recover"));
    }
}
