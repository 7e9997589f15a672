//! The web console in a real browser: headless Chromium (driven over the
//! DevTools protocol by `cca_bench::browser`) against `cca dev`. The
//! pages render the cluster's real state with the problems first (a
//! service that keeps crashing, demand no node can take), follow it live
//! (an instance killed under the open page shows its restart without a
//! reload), show errors (a page of a missing service, a program that does
//! not compile), and diff then apply a pasted program. With
//! `CCA_SCREENSHOTS=DIR` it saves the main pages there (docs/screenshots
//! holds the ones the README shows).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use cca_bench::browser::{Browser, Tab, chromium};
use serde_json::Value;
use support::dev::Dev;
use support::tenants::TwoTenants;

const PROGRAM: &str = r#"
service web {
  run = "cca whoami --port $PORT"
  replicas = 2
  port http 8080
  health {
    http "/"
    interval = 1s
    timeout = 500ms
  }
}

# Exits at once: the agent restarts it with backoff.
service batch {
  run = "echo loading the queue; sleep 1; echo cannot reach the queue >&2; exit 3"
}

# No node has 64Gi: the scheduler says so.
service big {
  run = "sleep 1000"
  resources { memory = 64Gi }
}
"#;

const WAIT: Duration = Duration::from_secs(60);

/// Chromium, or (not root) a skip that says why; root must have it.
fn have_chromium() -> bool {
    if chromium().is_some() {
        return true;
    }
    assert!(
        !rustix::process::geteuid().is_root(),
        "chromium is missing: scripts/test installs it (Debian package chromium)"
    );
    #[allow(clippy::print_stderr, reason = "a skipped test says why")]
    {
        eprintln!("skipped: chromium is missing and not root (scripts/test installs it as root)");
    }
    false
}

struct Console {
    browser: Browser,
    tab: Tab,
    shots: Option<PathBuf>,
}

impl Console {
    fn go(&mut self, hash: &str) {
        self.eval(&format!("location.hash = {}", js_string(hash)));
    }

    fn eval(&mut self, expression: &str) -> Value {
        self.browser
            .eval(&self.tab, expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
    }

    fn wait(&mut self, condition: &str) -> Value {
        self.browser
            .wait_for(&self.tab, condition, WAIT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for the live feed to have drawn `hash`'s page.
    fn shown(&mut self, hash: &str, condition: &str) -> Value {
        self.go(hash);
        self.wait(condition)
    }

    fn shoot(&mut self, name: &str) {
        if let Some(dir) = &self.shots {
            let path = dir.join(format!("{name}.png"));
            self.browser
                .screenshot(&self.tab, &path)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Types `text` into the diff page's editor and presses `button`.
    fn paste_and_press(&mut self, text: &str, button: &str) {
        self.eval(&format!(
            "(() => {{ const t = document.getElementById('program'); t.value = {}; \
             t.dispatchEvent(new Event('input')); document.getElementById({}).click(); }})()",
            js_string(text),
            js_string(button)
        ));
    }
}

fn js_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string encodes")
}

#[test]
fn the_console_shows_the_cluster_follows_it_live_and_diffs_a_pasted_program() {
    if !have_chromium() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), PROGRAM).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "--insecure", "app.cca"]);
    let (url, _) = dev.api_url();
    let mut browser = Browser::launch(1280, 1000).expect("chromium starts");
    let tab = browser.open(&format!("{url}/ui")).expect("a tab opens");
    let mut console = Console {
        browser,
        tab,
        shots: std::env::var_os("CCA_SCREENSHOTS").map(PathBuf::from),
    };

    // The overview: the cluster's real state, the problems first.
    console.wait(
        "document.querySelector('#card-instances [data-state=running]')?.textContent === '2' \
         && document.body.innerText.includes('service/batch') \
         && document.body.innerText.includes('memory')",
    );
    let verdict = console.eval("document.querySelector('[data-verdict]').dataset.verdict");
    assert!(
        verdict == "degraded" || verdict == "down",
        "a crashing service and unplaceable demand: {verdict}"
    );
    let text = console.eval("document.body.innerText");
    let text = text.as_str().unwrap_or_default();
    assert!(text.contains("service/big"), "{text}");
    assert!(text.contains("no node") || text.contains("64"), "{text}");
    console.shoot("overview");

    // A service's page, then one of its instances.
    console.shown(
        "#/services/web",
        "document.querySelectorAll('tr[data-instance][data-state=running]').length === 2",
    );
    console.shoot("service");
    let id = console.eval("document.querySelector('tr[data-instance]').dataset.instance");
    let id = id.as_str().expect("an instance id").to_owned();
    console.shown(
        &format!("#/instances/{id}"),
        "document.getElementById('instance-state')?.textContent === 'running'",
    );
    let pid = console.eval(&format!(
        "fetch('/v1/console/instances/{id}').then(r => r.json()).then(j => j.view.status.pid)"
    ));
    let pid = pid
        .as_i64()
        .and_then(|pid| i32::try_from(pid).ok())
        .expect("a pid");
    // Killed under the open page: the page shows the restart in place.
    console.eval("window.keptAcrossUpdates = window.ccaConsole.updates");
    support::signal(pid, "KILL");
    console.wait(
        "document.getElementById('instance-restarts')?.textContent === '1' \
         && window.keptAcrossUpdates !== undefined \
         && window.ccaConsole.updates > window.keptAcrossUpdates",
    );
    console.wait("document.getElementById('instance-state')?.textContent === 'running'");
    console.wait("document.getElementById('logs')?.textContent.includes('GET /')");
    console.shoot("instance");

    // The nodes list, and the events.
    console.shown(
        "#/nodes",
        "document.querySelector('tr[data-node] [data-health=healthy]') !== null",
    );
    console.shoot("nodes");
    console.shown(
        "#/events",
        "document.body.innerText.includes('restart') || document.body.innerText.includes('exited')",
    );

    // Errors say what is wrong.
    let missing = console.shown(
        "#/services/nope",
        "document.querySelector('[data-problem=\"404\"]')?.textContent",
    );
    assert_eq!(missing, "no service named `nope`");

    // Diff before apply: a program that does not compile, then one that
    // scales web to 3, applied.
    console.shown("#/diff", "document.getElementById('program') !== null");
    console.paste_and_press("service web {\n  replicas = three\n}\n", "diff");
    let error = console.wait("document.querySelector('#diff-result .error')?.textContent");
    let error = error.as_str().unwrap_or_default();
    assert!(error.contains("nothing was applied"), "{error}");
    assert!(
        error.contains("main.cca:2"),
        "the error names its line: {error}"
    );
    let scaled = PROGRAM.replace("replicas = 2", "replicas = 3");
    console.paste_and_press(&scaled, "diff");
    let report = console.wait("document.querySelector('[data-dry-run=\"true\"]')?.textContent");
    let report = report.as_str().unwrap_or_default();
    assert!(report.contains("changed desired/service/web"), "{report}");
    console.shoot("diff");
    console.eval("document.getElementById('apply').click()");
    console.wait(
        "document.querySelector('[data-dry-run=\"false\"]')?.textContent.includes('Applied')",
    );
    console.shown(
        "#/services/web",
        "document.querySelectorAll('tr[data-instance][data-state=running]').length === 3",
    );
    drop(console);
    dev.stop();
}

/// On the secure setup the console signs in with the link `cca dev`
/// prints (its token in the fragment, then out of the address bar); a
/// tab without it is asked for a token, and a wrong one is refused there.
#[test]
fn the_console_of_a_secure_cluster_signs_in_with_the_link_dev_prints() {
    if !have_chromium() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("app.cca"), PROGRAM).expect("writes the program");
    let dev = Dev::start(dir.path(), &["--data-dir", "data", "app.cca"]);
    let shown = dev.read_until(|line, _| line.contains("/ui#token="));
    let link = shown
        .lines()
        .find_map(|line| {
            line.split_whitespace()
                .find(|word| word.contains("/ui#token="))
        })
        .expect("the console's link")
        .to_owned();
    assert!(link.starts_with("https://127.0.0.1:"), "{link}");
    // The dev CA is the test's own: this browser is not asked to trust it.
    let mut browser =
        Browser::launch_with(1280, 900, &["--ignore-certificate-errors"]).expect("chromium starts");
    let tab = browser.open(&link).expect("a tab opens");
    browser
        .wait_for(
            &tab,
            "document.querySelector('#card-nodes .big')?.textContent === '1/1'",
            WAIT,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let address = browser.eval(&tab, "location.href").expect("evaluates");
    let address = address.as_str().unwrap_or_default();
    assert!(
        !address.contains("token"),
        "the token left the address bar: {address}"
    );
    let console = link.split('#').next().expect("the page's address");
    let stranger = browser.open(console).expect("a second tab opens");
    browser
        .wait_for(&stranger, "document.getElementById('token') !== null", WAIT)
        .unwrap_or_else(|e| panic!("a tab without the token is asked for one: {e}"));
    let asked = browser
        .eval(
            &stranger,
            "document.querySelector('form.signin p').textContent",
        )
        .expect("evaluates");
    browser
        .eval(
            &stranger,
            "document.getElementById('token').value = 'not-a-token'; \
             document.querySelector('form.signin button').click()",
        )
        .expect("evaluates");
    let refusal = browser
        .wait_for(
            &stranger,
            &format!(
                "document.getElementById('token') && \
                 document.querySelector('form.signin p').textContent !== {asked}"
            ),
            WAIT,
        )
        .unwrap_or_else(|e| panic!("a wrong token is refused: {e}"));
    assert_eq!(refusal, true);
    drop(browser);
    dev.stop();
}

/// The console's views read as their caller: alice (tenant `a`) sees her
/// tenant's service and none of bob's, is refused the overview (it counts
/// the whole cluster, as `status` does), and the local admin sees both.
#[test]
fn a_tenants_user_sees_only_their_tenant_in_the_console() {
    let (cluster, alice, _bob) = TwoTenants::with_two_tenants();
    let ca = cluster.config.join("ca.pem");
    let get = |token: Option<&str>, path: &str| -> (String, Value) {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
            .arg("--cacert")
            .arg(&ca);
        match token {
            Some(token) => curl.args(["-H", &format!("authorization: Bearer {token}")]),
            None => curl
                .arg("--cert")
                .arg(cluster.config.join("admin.pem"))
                .arg("--key")
                .arg(cluster.config.join("admin.key")),
        };
        let output = curl
            .arg(format!("{}{path}", cluster.server.url))
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').expect("a status line");
        (
            status.to_owned(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    };
    let names = |page: &Value| -> Vec<String> {
        page["view"]["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|row| row["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (status, page) = get(Some(&alice), "/v1/console/services");
    assert_eq!(status, "200", "{page}");
    assert_eq!(names(&page), ["web-a"]);
    let (status, page) = get(Some(&alice), "/v1/console/services/web-b");
    assert_eq!(status, "403", "{page}");
    let (status, _) = get(Some(&alice), "/v1/console/overview");
    assert_eq!(status, "403");
    let (status, page) = get(None, "/v1/console/services");
    assert_eq!(status, "200", "{page}");
    assert_eq!(names(&page), ["web-a", "web-b"]);
}
