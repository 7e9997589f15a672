//! The commands end to end over an in-memory file system: exit codes,
//! what is printed where, what is written, and template value precedence.

use std::path::PathBuf;

use cca_dsl::commands::{self, DiagnosticFormat, Io, Style, ValueOptions};
use cca_dsl::source::MemoryFs;

struct Run {
    code: i32,
    out: String,
    err: String,
}

fn run(command: impl FnOnce(&mut Io<'_>) -> std::io::Result<i32>) -> Run {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut io = Io {
        out: &mut out,
        err: &mut err,
        style: Style::default(),
    };
    let code = command(&mut io).expect("writes to memory succeed");
    Run {
        code,
        out: String::from_utf8(out).expect("utf-8"),
        err: String::from_utf8(err).expect("utf-8"),
    }
}

fn paths(names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(PathBuf::from).collect()
}

const UGLY: &str = "service web { image \"nginx\"; replicas 2 }\n";
const PRETTY: &str = "service web {\n  image = \"nginx\"\n  replicas = 2\n}\n";

#[test]
fn fmt_check_lists_files_that_would_change_and_writes_nothing() {
    let fs = MemoryFs::new().with("a.cca", UGLY).with("b.cca", PRETTY);
    let result = run(|io| commands::fmt(&fs, &paths(&["a.cca", "b.cca"]), true, io));
    assert_eq!(result.code, 1);
    assert_eq!(result.out, "a.cca\n");
    assert_eq!(fs.contents("a.cca"), Some(UGLY.as_bytes().to_vec()));
}

#[test]
fn fmt_rewrites_files_in_place() {
    let fs = MemoryFs::new().with("a.cca", UGLY);
    let result = run(|io| commands::fmt(&fs, &paths(&["a.cca"]), false, io));
    assert_eq!(result.code, 0);
    assert_eq!(fs.contents("a.cca"), Some(PRETTY.as_bytes().to_vec()));
    let again = run(|io| commands::fmt(&fs, &paths(&["a.cca"]), true, io));
    assert_eq!(again.code, 0);
}

#[test]
fn fmt_refuses_files_with_syntax_errors() {
    let fs = MemoryFs::new().with("bad.cca", "service web {\n");
    let result = run(|io| commands::fmt(&fs, &paths(&["bad.cca"]), false, io));
    assert_eq!(result.code, 2);
    assert!(
        result.err.contains("this block is never closed"),
        "{}",
        result.err
    );
    assert_eq!(fs.contents("bad.cca"), Some(b"service web {\n".to_vec()));
}

#[test]
fn lint_exit_code_follows_errors_not_warnings() {
    let fs = MemoryFs::new()
        .with("warn.cca", "secret unused\nservice a {\n  run = \"x\"\n}\n")
        .with("err.cca", "service a {\n  run = \"x\"\n  replica = 2\n}\n");
    let warn = run(|io| commands::lint(&fs, &paths(&["warn.cca"]), DiagnosticFormat::Human, io));
    assert_eq!(warn.code, 0);
    assert!(warn.err.contains("cca::W003"), "{}", warn.err);
    let err = run(|io| commands::lint(&fs, &paths(&["err.cca"]), DiagnosticFormat::Human, io));
    assert_eq!(err.code, 1);
    assert!(err.err.contains("err.cca:3:3"), "{}", err.err);
    assert!(err.err.contains("did you mean `replicas`?"), "{}", err.err);
}

#[test]
fn lint_json_gives_positions_and_codes() {
    let fs = MemoryFs::new().with("err.cca", "service a {\n  run = \"x\"\n  replica = 2\n}\n");
    let result = run(|io| commands::lint(&fs, &paths(&["err.cca"]), DiagnosticFormat::Json, io));
    assert_eq!(result.code, 1);
    let json: serde_json::Value = serde_json::from_str(&result.out).expect("valid JSON");
    let first = &json["diagnostics"][0];
    assert_eq!(first["code"], "cca::E011");
    assert_eq!(first["line"], 3);
    assert_eq!(first["column"], 3);
    assert_eq!(first["file"], "err.cca");
    assert_eq!(json["errors"], 1);
}

#[test]
fn lint_json_warns_about_settings_not_enforced_and_still_succeeds() {
    let text = "service a {\n  run = \"x\"\n  volume data \"/data\" 1Gi\n}\n";
    let fs = MemoryFs::new().with("scale.cca", text);
    let result = run(|io| commands::lint(&fs, &paths(&["scale.cca"]), DiagnosticFormat::Json, io));
    assert_eq!(result.code, 0);
    let json: serde_json::Value = serde_json::from_str(&result.out).expect("valid JSON");
    let diagnostics = json["diagnostics"].as_array().expect("a list");
    assert_eq!(diagnostics.len(), 1, "{json}");
    let warning = &diagnostics[0];
    assert_eq!(warning["code"], "cca::W008");
    assert_eq!(warning["severity"], "warning");
    assert_eq!(warning["line"], 3);
    let message = warning["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`volume size` is accepted but not enforced by this version"),
        "{message}"
    );
    assert_eq!(json["errors"], 0);
}

#[test]
fn lint_reports_unreadable_files() {
    let result = run(|io| {
        commands::lint(
            &MemoryFs::new(),
            &paths(&["gone.cca"]),
            DiagnosticFormat::Human,
            io,
        )
    });
    assert_eq!(result.code, 1);
    assert_eq!(result.err, "error: cannot read gone.cca: no such file\n");
}

const TEMPLATE: &str = "service web {\n  run = \"serve --port {{ values.port }}\"\n  replicas = {{ values.replicas }}\n}\n";

fn template_fs() -> MemoryFs {
    MemoryFs::new()
        .with("app/web.cca", TEMPLATE)
        .with("app/web/values.ccv", "port = 1\nreplicas = 1\n")
        .with("prod.ccv", "port = 2\n")
}

fn render_with(options: &ValueOptions) -> Run {
    let fs = template_fs();
    let env = |name: &str| (name == "WEB_PORT").then(|| "4".to_owned());
    run(|io| commands::render(&fs, "app/web.cca".as_ref(), options, &env, io))
}

#[test]
fn render_layers_values_in_precedence_order() {
    let auto = render_with(&ValueOptions::default());
    assert!(auto.out.contains("--port 1\""), "{}", auto.out);
    let file = render_with(&ValueOptions {
        files: paths(&["prod.ccv"]),
        ..ValueOptions::default()
    });
    assert!(file.out.contains("--port 2\""), "{}", file.out);
    let set = render_with(&ValueOptions {
        files: paths(&["prod.ccv"]),
        set: vec!["port=3".into()],
        ..ValueOptions::default()
    });
    assert!(set.out.contains("--port 3\""), "{}", set.out);
    let env = render_with(&ValueOptions {
        files: paths(&["prod.ccv"]),
        set: vec!["port=3".into()],
        set_from_env: vec!["port=WEB_PORT".into()],
    });
    assert!(env.out.contains("--port 4\""), "{}", env.out);
    assert!(env.out.contains("replicas = 1\n"), "{}", env.out);
}

#[test]
fn render_names_unset_values_and_missing_variables() {
    let fs = MemoryFs::new().with("t.cca", TEMPLATE);
    let env = |_: &str| None;
    let result =
        run(|io| commands::render(&fs, "t.cca".as_ref(), &ValueOptions::default(), &env, io));
    assert_eq!(result.code, 1);
    assert!(
        result.err.contains("value `port` is not set"),
        "{}",
        result.err
    );
    assert!(result.err.contains("t.cca:2:"), "{}", result.err);
    assert!(
        result.err.contains("value `replicas` is not set"),
        "{}",
        result.err
    );
    let missing = render_with(&ValueOptions {
        set_from_env: vec!["port=NOPE".into()],
        ..ValueOptions::default()
    });
    assert_eq!(missing.code, 1);
    assert_eq!(
        missing.err,
        "error: environment variable `NOPE` (for --set-from-env port=NOPE) is not set\n"
    );
}
