use super::*;

fn ctx() -> ScriptCtx {
    ScriptCtx {
        events_max_len: 100_000,
        cluster: false,
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
        let (code, function) = assemble(name, source, &ctx()).unwrap();
        assert!(
            function.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{function}"
        );
        assert!(
            code.contains(&format!("redis.register_function('{function}', ")),
            "{name}"
        );
        for (lib, _) in LIBRARIES {
            let n = code.matches(&format!("-- library: {lib}\n")).count();
            assert!(n <= 1, "{name} includes {lib} {n} times");
        }
        for placeholder in ["__EVENTS_MAXLEN__", "__CLUSTER__", "__CODES__"] {
            assert!(!code.contains(placeholder), "{name}: {placeholder}");
        }
        assert!(
            code.contains("KEYS, ARGV = keys, args\nP = tag_of(KEYS[1])\n"),
            "{name}"
        );
        if let Ok(dir) = std::env::var("MUSTER_DUMP_SCRIPTS") {
            let path = std::path::Path::new(&dir).join(format!("{}.lua", name.replace('/', "_")));
            std::fs::write(path, &code).unwrap();
        }
    }
    assert!(assemble("x", "--@include nope/lib\nreturn 1", &ctx()).is_err());
}

#[test]
fn error_codes_are_inlined_and_checked() {
    let code = assemble(
        "x",
        "-- E.NOT_FOUND stays in a comment\nreturn {E.TOO_MANY, E.TOO_MANY_QUEUES, NODE.x}",
        &ctx(),
    )
    .unwrap()
    .0;
    assert!(code.contains("return {(-12), (-5), NODE.x}\nend\n"), "{code}");
    assert!(
        code.ends_with(
            "xpcall(script_body, the_error)\nevents_flush()\nif not ok then error(res, 0) end\nreturn res\nend)\n"
        ),
        "{code}"
    );
    assert!(code.contains("-- E.NOT_FOUND stays in a comment"));
    let err = assemble("x", "return E.NOPE", &ctx()).unwrap_err();
    assert!(err.contains("unknown error code E.NOPE"), "{err}");
    for (name, source) in all_scripts() {
        let code = code_only(&assemble(&name, &source, &ctx()).unwrap().0);
        assert!(!mentions(&code, "E"), "{name} still names the code table E");
    }
}

#[test]
fn functions_no_kept_code_names_are_left_out() {
    let libs = "local K = 1\n-- mentions c in a comment\nlocal function a()\n  return K\nend\nlocal function b()\n  return a()\nend\nlocal function c()\n  return 3\nend\nlocal f\nf = function(x)\n  return b()\nend\n";
    let out = shake(libs, "return f(1)");
    assert!(
        out.contains("local function a()") && out.contains("local function b()"),
        "{out}"
    );
    assert!(out.contains("f = function(x)"));
    assert!(
        !out.contains("local function c()") && out.contains("-- (unused here: c)"),
        "{out}"
    );
    assert!(out.contains("local K = 1"));
    // A forward declaration does not keep its function.
    let none = shake(libs, "return 1");
    assert!(
        !none.contains("f = function(x)") && none.contains("local f\n"),
        "{none}"
    );
    assert!(!none.contains("local function a()"), "{none}");
}

#[test]
fn shaking_keeps_every_library_line_that_is_not_a_dropped_function() {
    // Parsing the real libraries: every function found ends with its own
    // `end` line, and nothing else is lost.
    for (lib, text) in LIBRARIES {
        let items = items(text);
        let mut joined = String::new();
        for item in &items {
            match item {
                Item::Other(t) => joined.push_str(t),
                Item::Function { text, name } => {
                    assert!(text.ends_with("end\n"), "{lib}: {name} does not end with `end`");
                    assert_eq!(
                        text.matches("\nlocal function ").count(),
                        0,
                        "{lib}: {name} swallowed another function"
                    );
                    joined.push_str(text);
                }
            }
        }
        assert_eq!(joined.trim_end(), text.trim_end(), "{lib}");
    }
}

#[test]
fn libraries_come_before_the_files_that_include_them() {
    let code = assemble("orphans/recover", "--@include orphans/lib\nreturn 1", &ctx())
        .unwrap()
        .0;
    let at = |s: &str| code.find(s).unwrap();
    assert!(at("-- library: nodes/liveness") < at("-- library: orphans/lib"));
    assert!(at("-- library: tasks/lib") < at("-- library: orphans/lib"));
    assert!(at("-- library: orphans/lib") < at("-- script: orphans/recover"));
}

#[test]
fn functions_are_named_by_script_and_text() {
    let (a, fa) = assemble("tasks/x-y", "return 1", &ctx()).unwrap();
    assert!(
        fa.starts_with("tasks_x_y_") && fa.len() == "tasks_x_y_".len() + 16,
        "{fa}"
    );
    let (_, same) = assemble("tasks/x-y", "return 1", &ctx()).unwrap();
    assert_eq!(fa, same);
    let (_, other_text) = assemble("tasks/x-y", "return 2", &ctx()).unwrap();
    let other_cfg = ScriptCtx {
        events_max_len: 7,
        ..ctx()
    };
    let (_, other_bound) = assemble("tasks/x-y", "return 1", &other_cfg).unwrap();
    assert!(fa != other_text && fa != other_bound);
    let lua = Lua::load("tasks/x-y", "return 1", &ctx());
    assert_eq!(lua.library(), format!("#!lua name={fa}\n{a}"));
}

/// Library-level state lives across calls of a function: whatever one
/// call may change must be reset at the start of the next, or a call
/// that failed halfway would leave it set (`wf_busy` stuck at true would
/// stop every workflow from advancing). Constants are UPPER_CASE;
/// anything else declared at the top level must be `-- @per-call`.
#[test]
fn library_state_is_reset_on_every_call() {
    let mut sources = vec![("store/prelude", PRELUDE)];
    sources.extend(LIBRARIES.iter().copied());
    for (lib, text) in sources {
        for item in items(text) {
            let Item::Other(lines) = item else { continue };
            for line in lines.lines().filter(|l| l.starts_with("local ")) {
                let decl = line.split("--").next().unwrap().trim_end();
                let Some((names, _)) = decl.strip_prefix("local ").unwrap().split_once(" = ") else {
                    continue; // a forward declaration, assigned a function later
                };
                let constant = names.split(',').all(|n| {
                    n.trim()
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                });
                assert!(
                    constant || line.ends_with("-- @per-call"),
                    "{lib}: `{line}` is state kept across calls: name it in UPPER_CASE if it is a \
                     constant, or mark it `-- @per-call`"
                );
            }
        }
    }
    let (code, _) = assemble("workflows/x", "--@include tasks/lib\nreturn wf_on_end", &ctx()).unwrap();
    let body = &code[code.find("redis.register_function(").unwrap()..];
    for reset in ["NOW = nil\n", "npending = 0\n", "wf_busy = false\n"] {
        assert!(
            body.find(reset).unwrap() < body.find("local late = begin()").unwrap(),
            "{reset}: {body}"
        );
    }
}
