//! `cca mcp` end to end, as an assistant runs it: the binary as a child
//! speaking MCP (JSON-RPC, one message a line) on its standard input and
//! output, against a server with a CA and two tenants' users. It reads as
//! the caller: alice's token sees tenant `a`'s service only, a read of
//! tenant `b`'s is refused by the API (and audited as alice's refusal;
//! her reads are audited too, `via mcp`),
//! the local admin sees both; a bad argument is an error, not an exit.
//! Over HTTP (`cca mcp --listen`, driven with curl), each request acts as
//! its own bearer token's user and never as the account that started the
//! server; a request without a token is refused.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};
use support::tenants::TwoTenants as Cluster;

/// A `cca mcp` child and its session.
struct Session {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Session {
    /// `cca mcp` logging on stderr to `log`, at the default filter.
    fn start(mut command: Command, log: &Path) -> Session {
        let mut child = command
            .arg("mcp")
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log"))
            .spawn()
            .expect("cca mcp starts");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut session = Session {
            child,
            input,
            output,
            next_id: 1,
        };
        let hello = session.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cca-test", "version": "0"},
            }),
        );
        assert_eq!(hello["result"]["serverInfo"]["name"], "cca", "{hello}");
        session.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        session
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.input, "{message}").expect("write to cca mcp");
        self.input.flush().expect("flush");
    }

    /// Sends a request and reads lines until its answer.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let read = self.output.read_line(&mut line).expect("read from cca mcp");
            assert!(read > 0, "cca mcp closed its output");
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == id {
                return message;
            }
        }
    }

    /// Calls `tool`: its answer as JSON, or the error's message.
    fn call(&mut self, tool: &str, arguments: Value) -> Result<Value, String> {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        if let Some(message) = answer["error"]["message"].as_str() {
            return Err(message.to_owned());
        }
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{tool}: {answer}"));
        if answer["result"]["isError"] == true {
            return Err(text.to_owned());
        }
        Ok(serde_json::from_str(text).expect("a JSON answer"))
    }
}

fn service_names(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|row| row["name"].as_str().expect("name").to_owned())
        .collect()
}

#[test]
fn cca_mcp_reads_as_its_caller_and_the_api_refuses_and_audits_what_they_may_not_read() {
    let (cluster, alice, _bob) = Cluster::with_two_tenants();

    let alice_log = cluster.dir.path().join("mcp-alice.log");
    let mut as_alice = Session::start(cluster.command(Some(&alice)), &alice_log);
    let tools = as_alice.request("tools/list", json!({}));
    assert!(
        tools.to_string().contains("explain_pending"),
        "the tools are listed: {tools}"
    );
    let seen = as_alice.call("list_services", json!({})).expect("a page");
    assert_eq!(service_names(&seen), ["web-a"], "{seen}");
    let refused = as_alice
        .call("describe_service", json!({"name": "web-b"}))
        .expect_err("another tenant's service");
    assert!(refused.contains("403"), "{refused}");
    let bad = as_alice
        .call("list_nodes", json!({"cursor": "page-2"}))
        .expect_err("not a cursor of ours");
    assert!(bad.contains("next_cursor"), "{bad}");
    // Still serving after the errors.
    let again = as_alice.call("list_services", json!({})).expect("a page");
    assert_eq!(again["total"], 1);

    // Each call is logged on stderr, where an assistant's host keeps a
    // server's log: the tool and how it ended.
    drop(as_alice);
    let log = std::fs::read_to_string(&alice_log).expect("the log");
    let logged = |tool: &str, outcome: &str| {
        log.lines().any(|line| {
            line.contains("MCP tool call") && line.contains(tool) && line.contains(outcome)
        })
    };
    assert!(logged("list_services", "ok"), "{log}");
    assert!(logged("describe_service", "error"), "{log}");

    let admin_log = cluster.dir.path().join("mcp-admin.log");
    let mut as_admin = Session::start(cluster.command(None), &admin_log);
    let all = as_admin.call("list_services", json!({})).expect("a page");
    assert_eq!(service_names(&all), ["web-a", "web-b"], "{all}");

    // The audit log is written behind the answer: a moment later. Her
    // refused read is there, and her reads too, as hers, via MCP.
    let refusal = |line: &str| {
        line.contains("user:alice") && line.contains("/v1/services/web-b") && line.contains("403")
    };
    let read = |line: &str| {
        line.contains("user:alice")
            && line.contains("GET")
            && line.contains("/v1/services ")
            && line.contains("200")
            && line.contains("via mcp")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let audit = cluster.ok(&["audit", "--who", "user:alice"]);
        if audit.lines().any(refusal) && audit.lines().any(read) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "alice's refused read and her reads are not in the audit log:\n{audit}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// One MCP session over HTTP, driven with curl as a user: the server's
/// `/mcp` URL, the user's token and the session id the server gave.
struct HttpSession {
    url: String,
    token: Option<String>,
    session: Option<String>,
}

impl HttpSession {
    /// POSTs `message`: the status line, the headers, and the JSON-RPC
    /// message of the answer (its JSON body, or the event of an SSE body).
    fn post(&self, message: &Value) -> (String, String, Option<Value>) {
        let mut curl = Command::new("curl");
        curl.args(["-s", "-i", "--max-time", "10", "-X", "POST"])
            .args(["-H", "content-type: application/json"])
            .args(["-H", "accept: application/json, text/event-stream"])
            .args(["-H", "mcp-protocol-version: 2025-06-18"])
            .args(["--data", &message.to_string()]);
        if let Some(token) = &self.token {
            curl.args(["-H", &format!("authorization: Bearer {token}")]);
        }
        if let Some(session) = &self.session {
            curl.args(["-H", &format!("mcp-session-id: {session}")]);
        }
        let output = curl.arg(&self.url).output().expect("curl runs");
        let text = String::from_utf8_lossy(&output.stdout).replace("\r\n", "\n");
        let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
        let status = head.lines().next().unwrap_or_default().to_owned();
        let answer = body
            .lines()
            .map(|line| line.strip_prefix("data:").unwrap_or(line).trim())
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|value| value.get("id").is_some());
        (status, head.to_owned(), answer)
    }

    fn start(url: &str, token: Option<&str>) -> HttpSession {
        let mut session = HttpSession {
            url: url.to_owned(),
            token: token.map(str::to_owned),
            session: None,
        };
        let (status, head, answer) = session.post(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "curl", "version": "0"},
            },
        }));
        assert!(status.contains("200"), "{status}\n{head}\n{answer:?}");
        session.session = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("mcp-session-id")
                .then(|| value.trim().to_owned())
        });
        session.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        session
    }

    /// Calls `tool`: its answer as JSON, or the error's message.
    fn call(&self, tool: &str, arguments: Value) -> Result<Value, String> {
        let (status, _, answer) = self.post(&json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }));
        let answer = answer.unwrap_or_else(|| panic!("{tool}: no answer ({status})"));
        if let Some(message) = answer["error"]["message"].as_str() {
            return Err(message.to_owned());
        }
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{tool}: {answer}"));
        Ok(serde_json::from_str(text).expect("a JSON answer"))
    }
}

#[test]
fn cca_mcp_over_http_acts_as_each_requests_bearer_token_never_as_its_starter() {
    let (cluster, alice, bob) = Cluster::with_two_tenants();

    // Started by the local admin (whose certificate sees everything).
    let mut server = cluster
        .command(None)
        .args(["mcp", "--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cca mcp --listen starts");
    let mut stderr = BufReader::new(server.stderr.take().expect("stderr"));
    let url = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).expect("stderr") > 0,
            "cca mcp exited before it served"
        );
        if let Some(at) = line.find("http://") {
            let url = line[at..].split_whitespace().next().expect("a URL");
            break url.to_owned();
        }
    };
    let server = ServerProcess(server);

    let anonymous = HttpSession {
        url: url.clone(),
        token: None,
        session: None,
    };
    let (status, head, _) = anonymous.post(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert!(status.contains("401"), "{status}\n{head}");

    let as_alice = HttpSession::start(&url, Some(&alice));
    let seen = as_alice.call("list_services", json!({})).expect("a page");
    assert_eq!(service_names(&seen), ["web-a"], "{seen}");
    let refused = as_alice
        .call("describe_service", json!({"name": "web-b"}))
        .expect_err("another tenant's");
    assert!(refused.contains("403"), "{refused}");

    let as_bob = HttpSession::start(&url, Some(&bob));
    let seen = as_bob.call("list_services", json!({})).expect("a page");
    assert_eq!(service_names(&seen), ["web-b"], "{seen}");

    let forged = HttpSession::start(&url, Some("not-a-token"));
    let error = forged
        .call("list_services", json!({}))
        .expect_err("the API refuses a forged token");
    assert!(error.contains("401"), "{error}");
    drop(server);
}

/// Kills the child when dropped, pass or fail.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
