//! Lua scripts: one file per atomic state change, loaded through [`Lua`].
//!
//! Each script is the shared prelude (`lua/prelude.lua`: the namespace prefix,
//! Redis time, the event emitter) followed by the script's own file. The
//! prefix and the stream bound are substituted into the text once, at start,
//! so the scripts need no extra arguments for them; the SHA differs per
//! namespace, which is harmless. redis-rs sends EVALSHA and loads the script
//! on NOSCRIPT, so a Redis restart or failover needs no special handling.

/// Values substituted into every script.
#[derive(Debug, Clone)]
pub struct ScriptCtx {
    /// The hash-tagged prefix, `{muster}`.
    pub prefix: String,
    pub events_max_len: u64,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// A loaded-on-demand script with a name for metrics and logs.
#[derive(Debug, Clone)]
pub struct Lua {
    name: &'static str,
    script: redis::Script,
}

impl Lua {
    pub fn new(name: &'static str, source: &str, ctx: &ScriptCtx) -> Self {
        Self::with_libs(name, &[], source, ctx)
    }

    /// A script preceded by the prelude and then by shared helper files (a
    /// subsystem's `lib.lua`), since Redis scripts cannot include files.
    pub fn with_libs(name: &'static str, libs: &[&str], source: &str, ctx: &ScriptCtx) -> Self {
        let mut code = PRELUDE
            .replace("__PREFIX__", &ctx.prefix)
            .replace("__EVENTS_MAXLEN__", &ctx.events_max_len.to_string());
        for lib in libs {
            code.push('\n');
            code.push_str(lib);
        }
        code.push_str(&format!("\n-- script: {name}\n{source}"));
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
