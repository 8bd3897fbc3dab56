//! Lua scripts: one file per atomic state change, loaded through [`Lua`].
//!
//! Each script is a Redis function in a library of its own (`FUNCTION LOAD`,
//! called with `FCALL`): the library holds the shared prelude
//! (`lua/prelude.lua`: the namespace prefix, the deadline check of G12, Redis
//! time, the event emitter), then the libraries the script includes, then
//! one `redis.register_function` whose body is the script's file. Loading
//! runs the prelude and the libraries once; a call runs only the script's
//! own code (with EVAL every call defined every library function anew,
//! which cost about a sixth of a call's Redis CPU). A script or library
//! names what it needs on header lines `--@include <library>`; they are
//! resolved depth first, each library once, before the file that names
//! them (see [`LIBRARIES`]). The stream bound and the Cluster flag are
//! substituted into the text once, at start. The namespace is not: every
//! call takes its prefix `P` from the hash tag of its first key, so one
//! library serves every namespace on a server and every shard of a
//! namespace (`docs/sharding.md`): a shard is only another set of keys.
//!
//! A library and its function are named after the script and a hash of the
//! library's text (`tasks_claim_3f9a…`), so nodes of different versions on
//! one Redis never replace each other's code, and `FCALL`
//! shows in `SLOWLOG` and `MONITOR` by name. A call that finds its function
//! missing (a new or restarted Redis, a failover to a replica that missed
//! the load, `FUNCTION FLUSH`) loads the library and calls again: nothing
//! ran the first time, so nothing runs twice. Should the function be gone
//! again on that second call (a flush raced the load), nothing ran either:
//! the call fails as unavailable (`TRYAGAIN`, a 503 to the client), never as
//! a server error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

pub(crate) mod sweep;

/// Values substituted into every script.
#[derive(Debug, Clone)]
pub struct ScriptCtx {
    pub events_max_len: u64,
    /// The namespace is on a Redis Cluster: tokens check which master hands
    /// them out (`fence_epoch` in the prelude).
    pub cluster: bool,
}

/// The library names of the scripts [`Lua::load`] assembled, by the value
/// of their context (the same binary and the same values make the same
/// libraries, so nodes in one process with equal contexts share a set).
/// Bounded: one set per distinct context, each at most the binary's scripts.
static ASSEMBLED: Mutex<BTreeMap<String, BTreeSet<String>>> = Mutex::new(BTreeMap::new());

impl ScriptCtx {
    /// The function libraries of every script loaded with this context (or
    /// an equal one) in this process: once a node has built its services,
    /// the libraries it uses (as `FUNCTION LIST` names them).
    pub fn libraries(&self) -> Vec<String> {
        let all = ASSEMBLED.lock().unwrap_or_else(|e| e.into_inner());
        all.get(&self.registry_key())
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn registry_key(&self) -> String {
        format!("{self:?}")
    }
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

/// The source lines `local NAME = VALUE -- @per-call` of the prelude and
/// the libraries: state one call may change, reset at the start of every
/// call, as `NAME = VALUE`.
fn per_call_resets(code: &str) -> String {
    code.lines()
        .filter_map(|l| l.strip_suffix("-- @per-call"))
        .filter_map(|l| l.trim_end().strip_prefix("local "))
        .map(|decl| format!("{decl}\n"))
        .collect()
}

/// The library text for a script, without its `#!lua name=` line, and the
/// name of its library and function.
pub(crate) fn assemble(name: &str, source: &str, ctx: &ScriptCtx) -> Result<(String, String), String> {
    let mut code = PRELUDE
        .replace("__EVENTS_MAXLEN__", &ctx.events_max_len.to_string())
        .replace("__CLUSTER__", if ctx.cluster { "true" } else { "false" });
    let mut libs = String::new();
    let mut seen = Vec::new();
    resolve(source, &mut libs, &mut seen).map_err(|e| format!("script {name}: {e}"))?;
    code.push_str(&shake(&libs, source));
    let resets = per_call_resets(&code);
    // The script's body is a function of its own, defined once when the
    // library loads, so that the call's events are written after it
    // (`events_flush`), also when it failed halfway: what it changed before
    // the error stays (Redis has no rollback), and so does what it said
    // about that. `xpcall`, not `pcall`: Redis's `pcall` turns the error
    // of a failed command into its text, which would reach the caller as a
    // script error (`ERR ...`); the error itself keeps its code (`READONLY`,
    // `OOM`, ...), which the store classifies.
    code.push_str(&format!(
        "\nlocal function script_body()\n-- script: {name}\n{source}\nend\n"
    ));
    code.push_str(
        "redis.register_function('__FUNCTION__', function(keys, args)\nKEYS, ARGV = keys, args\nP = tag_of(KEYS[1])\n",
    );
    code.push_str(&resets);
    code.push_str(
        "local late = begin()\nif late then return late end\nlocal ok, res = xpcall(script_body, the_error)\nevents_flush()\n\
         if not ok then error(res, 0) end\nreturn res\nend)\n",
    );
    let code = inline_codes(&code).map_err(|e| format!("script {name}: {e}"))?;
    let digest = Sha256::digest(code.as_bytes());
    let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let stem: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let function = format!("{stem}_{hash}");
    Ok((code.replace("__FUNCTION__", &function), function))
}

/// One top-level piece of a library: a function definition (`local function
/// NAME(` or `NAME = function(`, through the `end` in column 0, or one line
/// that ends in ` end`) or any other
/// lines (constants, forward declarations, comments).
enum Item<'a> {
    Function { name: &'a str, text: String },
    Other(String),
}

fn function_name(line: &str) -> Option<&str> {
    let ident = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map(|n| n.min(s.len()))
    };
    if let Some(rest) = line.strip_prefix("local function ") {
        let n = ident(rest)?;
        return rest[n..].starts_with('(').then(|| &rest[..n]);
    }
    let n = ident(line)?;
    (n > 0 && line[n..].starts_with(" = function(")).then(|| &line[..n])
}

fn items(libs: &str) -> Vec<Item<'_>> {
    let mut out = Vec::new();
    let mut other = String::new();
    let mut lines = libs.lines();
    while let Some(line) = lines.next() {
        let Some(name) = function_name(line) else {
            other.push_str(line);
            other.push('\n');
            continue;
        };
        out.push(Item::Other(std::mem::take(&mut other)));
        let mut text = format!("{line}\n");
        // A one-line function (`local function f(x) return x end`) ends here.
        if !line.trim_end().ends_with(" end") {
            for l in lines.by_ref() {
                text.push_str(l);
                text.push('\n');
                if l == "end" {
                    break;
                }
            }
        }
        out.push(Item::Function { name, text });
    }
    out.push(Item::Other(other));
    out
}

/// The code without its `--` comments and forward declarations (`local
/// name` alone on a line: it names a function without using it), for looking
/// up names.
fn code_only(text: &str) -> String {
    let forward = |l: &str| {
        l.strip_prefix("local ")
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    };
    text.lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .filter(|l| !forward(l.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn mentions(code: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The libraries without the functions the script cannot reach: a claim
/// needs a few of the task library's thirty functions, and each of the
/// script's own function libraries (about 60 per namespace) holds only
/// what it uses. (When scripts ran with EVALSHA this also saved Redis CPU on
/// every call, which defined each library function anew.) A function is kept when its name appears in the
/// script, in the libraries' other lines, or in a kept function (comments
/// ignored); Lua resolves local names lexically, so a function no kept code
/// names cannot be called, and dropping it changes nothing else.
fn shake(libs: &str, source: &str) -> String {
    let items = items(libs);
    let mut reach = code_only(source);
    for item in &items {
        if let Item::Other(text) = item {
            reach.push_str(&code_only(text));
        }
    }
    let mut keep = vec![false; items.len()];
    loop {
        let mut grew = false;
        for (i, item) in items.iter().enumerate() {
            if let Item::Function { name, text } = item
                && !keep[i]
                && mentions(&reach, name)
            {
                keep[i] = true;
                reach.push_str(&code_only(text));
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = String::with_capacity(libs.len());
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::Other(text) => out.push_str(text),
            Item::Function { text, .. } if keep[i] => out.push_str(text),
            Item::Function { name, .. } => out.push_str(&format!("-- (unused here: {name})\n")),
        }
    }
    out
}

/// `E.NAME` replaced by the code's value outside comments, so a call does
/// not build a code table. An unknown name is an error (a typo would
/// otherwise be a runtime error on the path that uses it).
fn inline_codes(code: &str) -> Result<String, String> {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let (text, comment) = match line.find("--") {
            Some(at) => line.split_at(at),
            None => (line, ""),
        };
        inline_line(text, &mut out)?;
        out.push_str(comment);
        out.push('\n');
    }
    Ok(out)
}

fn inline_line(text: &str, out: &mut String) -> Result<(), String> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut rest = text;
    let mut prev: Option<char> = None;
    while let Some(at) = rest.find("E.") {
        let before = rest[..at].chars().next_back().or(prev);
        let tail = &rest[at + 2..];
        let len = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        if before.is_some_and(is_ident) || len == 0 {
            out.push_str(&rest[..at + 2]);
            prev = Some('.');
            rest = tail;
            continue;
        }
        let name = &tail[..len];
        let c = super::codes::Code::ALL
            .iter()
            .find(|c| c.lua_name() == name)
            .ok_or_else(|| format!("unknown error code E.{name}"))?;
        out.push_str(&rest[..at]);
        out.push_str(&format!("({})", *c as i64));
        prev = Some(')');
        rest = &tail[len..];
    }
    out.push_str(rest);
    Ok(())
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

/// A script: its Redis function and the library that defines it, loaded
/// on demand.
#[derive(Debug, Clone)]
pub struct Lua {
    name: &'static str,
    function: String,
    library: String,
}

impl Lua {
    /// Script `name` with the includes its source declares. The sources are
    /// compiled in, so an unknown include is a bug caught by the unit test
    /// that assembles every script; it panics at start, never later.
    pub fn load(name: &'static str, source: &str, ctx: &ScriptCtx) -> Self {
        let (code, function) = assemble(name, source, ctx).unwrap_or_else(|e| panic!("{e}"));
        ASSEMBLED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ctx.registry_key())
            .or_default()
            .insert(function.clone());
        Lua {
            name,
            library: format!("#!lua name={function}\n{code}"),
            function,
        }
    }

    /// The script's name, for metrics and logs (`tasks/claim`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Redis function's name (`tasks_claim_3f9a…`).
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The library's text, as `FUNCTION LOAD` takes it.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Calls the script on `conn` (`FCALL`); when Redis does not have its
    /// function, loads the library and calls once more. `args` ends with
    /// the deadline (see the prelude).
    pub async fn call<T, C>(&self, conn: &mut C, keys: &[String], args: &[String]) -> redis::RedisResult<T>
    where
        T: redis::FromRedisValue,
        C: redis::aio::ConnectionLike,
    {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&self.function).arg(keys.len()).arg(keys).arg(args);
        match fcall.query_async(conn).await {
            Err(e) if is_function_missing(&e) => {
                tracing::debug!(script = self.name, "loading the script's function library");
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&self.library)
                    .query_async::<()>(conn)
                    .await?;
                match fcall.query_async(conn).await {
                    Err(e) if is_function_missing(&e) => Err(vanished(self.name)),
                    other => other,
                }
            }
            other => other,
        }
    }
}

/// `FCALL` of a function Redis does not have: nothing ran.
fn is_function_missing(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("Function not found"))
}

/// The function went missing again between its load and the call (a
/// `FUNCTION FLUSH` or `FUNCTION DELETE` ran in between): nothing ran. A
/// `TRYAGAIN` error, which the store classifies as unavailable (503: the
/// caller may retry), not as a server error (500).
fn vanished(script: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
        "script function removed",
        format!(
            "the function of script {script} was removed again right after it was loaded \
             (FUNCTION FLUSH or DELETE); nothing ran"
        ),
    ))
}

#[cfg(test)]
mod tests;
