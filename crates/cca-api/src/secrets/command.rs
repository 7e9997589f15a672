//! The external key-encryption key: a program the operator names
//! (`--secret-key-command`, for a KMS) run as `PROGRAM [ARGS] wrap KEY_ID`
//! or `PROGRAM [ARGS] unwrap KEY_ID` with the key (or the wrapped key) in
//! base64 on stdin and the answer in base64 on stdout, within a timeout.
//! A failure names the program, the operation, the key id, the exit status
//! and stderr (cut short, any echo of its input replaced), never a key.
//! Running the process is the side effect behind [`CommandRunner`]:
//! [`ProcessRunner`] spawns it, [`RecordingRunner`] records the requests
//! and answers as told, for tests.

use std::fmt;
use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::envelope::{DataKey, KeyProvider};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{ProviderError, SecretKeyError};

/// How long one call of the command may take unless told otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of stdout read: a wrapped key is far smaller.
const MAX_STDOUT: u64 = 64 * 1024;
/// The most of stderr read, and the most quoted in an error.
const MAX_STDERR: u64 = 8 * 1024;
const QUOTED_STDERR: usize = 500;

/// One run of the command. `Debug` hides stdin (a key, or a wrapped key).
#[derive(Clone, PartialEq, Eq)]
pub struct CommandRequest {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
}

impl fmt::Debug for CommandRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandRequest")
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "stdin",
                &format_args!("<{} bytes redacted>", self.stdin.len()),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What the command answered. `Debug` hides stdout and stderr.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl fmt::Debug for CommandOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandOutput")
            .field("code", &self.code)
            .field(
                "stdout",
                &format_args!("<{} bytes redacted>", self.stdout.len()),
            )
            .field(
                "stderr",
                &format_args!("<{} bytes redacted>", self.stderr.len()),
            )
            .finish()
    }
}

/// A run that produced no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The program could not be started (missing, not executable).
    Spawn(String),
    /// It ran past the timeout and was killed.
    Timeout,
    /// Talking to it failed.
    Io(String),
}

/// Runs a command: the process side effect of [`CommandProvider`].
pub trait CommandRunner: fmt::Debug + Send + Sync {
    fn run(&self, request: &CommandRequest) -> Result<CommandOutput, RunError>;
}

/// Spawns the program, feeds stdin, reads stdout and stderr, and kills it
/// at the timeout.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessRunner;

impl CommandRunner for ProcessRunner {
    fn run(&self, request: &CommandRequest) -> Result<CommandOutput, RunError> {
        let deadline = Instant::now() + request.timeout;
        let mut child = std::process::Command::new(&request.program)
            .args(&request.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| RunError::Spawn(error.to_string()))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A few dozen bytes fit the pipe; a program that exits without
            // reading them breaks the pipe, and its exit status tells why.
            match stdin.write_all(&request.stdin) {
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                    kill(&mut child);
                    return Err(RunError::Io(format!("writing its stdin: {error}")));
                }
                _ => {}
            }
        }
        let stdout = reader(child.stdout.take(), MAX_STDOUT);
        let stderr = reader(child.stderr.take(), MAX_STDERR);
        let Ok(stdout) = stdout.recv_timeout(remaining(deadline)) else {
            kill(&mut child);
            return Err(RunError::Timeout);
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    kill(&mut child);
                    return Err(RunError::Timeout);
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(error) => {
                    kill(&mut child);
                    return Err(RunError::Io(format!("waiting for it: {error}")));
                }
            }
        };
        // A child it left behind may hold stderr open: do not wait for it.
        let stderr = stderr
            .recv_timeout(remaining(deadline).min(Duration::from_millis(100)))
            .unwrap_or_default();
        Ok(CommandOutput {
            code: status.code(),
            stdout,
            stderr,
        })
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads `pipe` to its end (at most `limit` bytes) on a thread of its own,
/// so a deadline can be kept while it reads.
fn reader(pipe: Option<impl Read + Send + 'static>, limit: u64) -> mpsc::Receiver<Vec<u8>> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let _ = pipe.take(limit).read_to_end(&mut bytes);
        }
        let _ = send.send(bytes);
    });
    receive
}

type Answer = dyn Fn(&CommandRequest) -> Result<CommandOutput, RunError> + Send + Sync;

/// A [`CommandRunner`] that records every request and answers with a
/// function of it: for tests of the provider without processes.
pub struct RecordingRunner {
    calls: Mutex<Vec<CommandRequest>>,
    answer: Box<Answer>,
}

impl fmt::Debug for RecordingRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingRunner")
            .field("calls", &self.calls().len())
            .finish_non_exhaustive()
    }
}

impl RecordingRunner {
    pub fn new(
        answer: impl Fn(&CommandRequest) -> Result<CommandOutput, RunError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            calls: Mutex::default(),
            answer: Box::new(answer),
        }
    }

    /// Every request so far, oldest first.
    pub fn calls(&self) -> Vec<CommandRequest> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl CommandRunner for RecordingRunner {
    fn run(&self, request: &CommandRequest) -> Result<CommandOutput, RunError> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(request.clone());
        (self.answer)(request)
    }
}

/// A KEK held by an external program (a KMS). `Debug` shows the program
/// and key id, which are not secret.
#[derive(Clone)]
pub struct CommandProvider {
    program: String,
    args: Vec<String>,
    key_id: String,
    timeout: Duration,
    runner: Arc<dyn CommandRunner>,
}

impl fmt::Debug for CommandProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandProvider")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("key_id", &self.key_id)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl CommandProvider {
    /// The KEK `key_id` of `command` (a program and its arguments,
    /// separated by spaces; no quoting), run as a process.
    pub fn new(command: &str, key_id: &str, timeout: Duration) -> Result<Self, SecretKeyError> {
        let mut words = command.split_ascii_whitespace().map(str::to_owned);
        let program = words.next().ok_or_else(|| SecretKeyError::NoProgram {
            command: command.to_owned(),
        })?;
        let usable = !key_id.is_empty()
            && key_id.len() <= 256
            && !key_id.starts_with('-')
            && key_id.chars().all(|c| c.is_ascii_graphic());
        if !usable {
            return Err(SecretKeyError::BadKeyId {
                id: key_id.to_owned(),
            });
        }
        Ok(Self {
            program,
            args: words.collect(),
            key_id: key_id.to_owned(),
            timeout,
            runner: Arc::new(ProcessRunner),
        })
    }

    /// The same KEK, run through `runner`.
    #[must_use]
    pub fn with_runner(mut self, runner: Arc<dyn CommandRunner>) -> Self {
        self.runner = runner;
        self
    }

    /// The same command for another KEK of the same KMS.
    pub fn for_key(&self, key_id: &str) -> Result<Self, SecretKeyError> {
        let command = std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Self::new(&command, key_id, self.timeout)?.with_runner(Arc::clone(&self.runner)))
    }

    fn call(&self, operation: &'static str, input: &[u8]) -> Result<Vec<u8>, ProviderError> {
        let encoded = BASE64.encode(input);
        let mut args = self.args.clone();
        args.extend([operation.to_owned(), self.key_id.clone()]);
        let request = CommandRequest {
            program: self.program.clone(),
            args,
            stdin: format!("{encoded}\n").into_bytes(),
            timeout: self.timeout,
        };
        let program = self.program.clone();
        let output = self.runner.run(&request).map_err(|error| match error {
            RunError::Spawn(problem) => ProviderError::Spawn { program, problem },
            RunError::Timeout => ProviderError::Timeout {
                program,
                operation,
                key_id: self.key_id.clone(),
                after: self.timeout,
            },
            RunError::Io(problem) => ProviderError::Io { program, problem },
        })?;
        if output.code != Some(0) {
            return Err(ProviderError::Failed {
                program: self.program.clone(),
                operation,
                key_id: self.key_id.clone(),
                status: match output.code {
                    Some(code) => format!("exit status {code}"),
                    None => "killed by a signal".to_owned(),
                },
                stderr: quote_stderr(&output.stderr, &encoded),
            });
        }
        let garbage = |problem: String| ProviderError::Garbage {
            program: self.program.clone(),
            operation,
            key_id: self.key_id.clone(),
            problem,
        };
        let text = std::str::from_utf8(&output.stdout)
            .map_err(|_| garbage(format!("stdout is {} bytes of binary", output.stdout.len())))?
            .trim();
        if text.is_empty() {
            return Err(garbage("stdout is empty".to_owned()));
        }
        BASE64
            .decode(text)
            .ok()
            .filter(|bytes| !bytes.is_empty())
            .ok_or_else(|| garbage(format!("stdout is not base64 ({} bytes)", text.len())))
    }
}

/// Stderr for an error message: text, cut short, with any echo of what
/// the command was given replaced.
fn quote_stderr(stderr: &[u8], given: &str) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        return "(nothing on stderr)".to_owned();
    }
    let text = if given.is_empty() {
        text.to_owned()
    } else {
        text.replace(given, "<redacted>")
    };
    match text.char_indices().nth(QUOTED_STDERR) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

impl KeyProvider for CommandProvider {
    fn key_id(&self) -> &str {
        &self.key_id
    }

    fn wrap(&self, data_key: &DataKey) -> Result<Vec<u8>, ProviderError> {
        self.call("wrap", data_key.bytes())
    }

    fn unwrap(&self, wrapped: &[u8]) -> Result<DataKey, ProviderError> {
        let bytes = self.call("unwrap", wrapped)?;
        DataKey::from_bytes(&bytes).ok_or_else(|| ProviderError::Garbage {
            program: self.program.clone(),
            operation: "unwrap",
            key_id: self.key_id.clone(),
            problem: format!("the unwrapped key is {} bytes, not 32", bytes.len()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::{SecretError, SecretKey, SecretValue};

    /// A stand-in KMS for tests: "wraps" by prefixing the key id and
    /// checks it on unwrap; no secrecy, only the protocol.
    const FAKE_KMS: &str = r#"op="$1"; id="$2"; input=$(cat)
case "$op" in
wrap) printf '%s:%s' "$id" "$input" | base64 -w0 ;;
unwrap) decoded=$(printf '%s' "$input" | base64 -d) || exit 4
  case "$decoded" in
  "$id:"*) printf '%s\n' "${decoded#"$id:"}" ;;
  *) echo "not wrapped by $id" >&2; exit 3 ;;
  esac ;;
*) echo "unknown operation $op" >&2; exit 2 ;;
esac
"#;

    /// A provider running `script` with `sh` (not executed directly: a
    /// file just written may be busy in a forked test thread).
    fn script(dir: &tempfile::TempDir, name: &str, body: &str, key_id: &str) -> CommandProvider {
        let path = dir.path().join(name);
        std::fs::write(&path, body).expect("script written");
        CommandProvider::new(
            &format!("/bin/sh {}", path.display()),
            key_id,
            Duration::from_secs(5),
        )
        .expect("provider")
    }

    #[test]
    fn values_round_trip_through_a_kms_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kms = script(&dir, "kms.sh", FAKE_KMS, "kek-1");
        let key = SecretKey::new(kms.clone());
        let value = SecretValue::new("hunter2");
        let sealed = key.seal("db", &value, 1).expect("sealed");
        assert_eq!(sealed.key_id, "kek-1");
        assert_eq!(key.open("db", &sealed), Ok(value.clone()));
        // Another key id of the same KMS refuses it, with its stderr.
        let other = SecretKey::new(kms.for_key("kek-2").expect("id")).accepting(kms);
        assert_eq!(other.open("db", &sealed), Ok(value.clone()));
        let mut moved = sealed.clone();
        moved.key_id = "kek-2".into();
        let error = other.open("db", &moved).expect_err("wrong kek");
        let text = error.to_string();
        assert!(
            text.contains("unwrap kek-2")
                && text.contains("exit status 3")
                && text.contains("not wrapped by kek-2"),
            "{text}"
        );
    }

    #[test]
    fn the_command_sees_its_operation_key_id_and_base64_key() {
        // An identity "KMS": the wrapped key is the key.
        let runner = Arc::new(RecordingRunner::new(|request| {
            Ok(CommandOutput {
                code: Some(0),
                stdout: request.stdin.clone(),
                stderr: Vec::new(),
            })
        }));
        let provider = CommandProvider::new(
            "/usr/local/bin/my-kms --region eu",
            "kek-1",
            DEFAULT_COMMAND_TIMEOUT,
        )
        .expect("provider")
        .with_runner(Arc::clone(&runner) as Arc<dyn CommandRunner>);
        let data_key = DataKey::from_bytes(&[0xab; 32]).expect("32 bytes");
        let wrapped = provider.wrap(&data_key).expect("wraps");
        assert_eq!(
            provider.unwrap(&wrapped).expect("unwraps").bytes(),
            &[0xab; 32]
        );
        let calls = runner.calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].program, "/usr/local/bin/my-kms");
        assert_eq!(calls[0].args, ["--region", "eu", "wrap", "kek-1"]);
        assert_eq!(calls[1].args, ["--region", "eu", "unwrap", "kek-1"]);
        let key_text = format!("{}\n", BASE64.encode([0xab; 32]));
        assert_eq!(calls[0].stdin, key_text.as_bytes());
        let output = CommandOutput {
            code: Some(0),
            stdout: key_text.clone().into_bytes(),
            stderr: key_text.clone().into_bytes(),
        };
        for shown in [
            format!("{calls:?}"),
            format!("{provider:?}"),
            format!("{runner:?}"),
            format!("{output:?}"),
            format!("{data_key:?}"),
        ] {
            assert!(!shown.contains(key_text.trim()), "{shown}");
        }
    }

    #[test]
    fn command_failures_say_what_failed_and_never_show_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_key = DataKey::from_bytes(&[0xab; 32]).expect("32 bytes");
        let key_text = BASE64.encode([0xab; 32]);

        let missing = CommandProvider::new("/nonexistent/my-kms", "k", DEFAULT_COMMAND_TIMEOUT)
            .expect("provider");
        let error = missing.wrap(&data_key).expect_err("missing").to_string();
        assert!(
            error.contains("`/nonexistent/my-kms` could not be started")
                && error.contains("No such file"),
            "{error}"
        );

        // Echoes its input to stderr and fails: the echo is redacted.
        let failing = script(
            &dir,
            "fail.sh",
            "echo \"denied for $(cat)\" >&2; exit 7",
            "k",
        );
        let error = failing.wrap(&data_key).expect_err("fails").to_string();
        assert!(
            error.contains("wrap k")
                && error.contains("exit status 7")
                && error.contains("denied for <redacted>"),
            "{error}"
        );
        assert!(!error.contains(&key_text), "{error}");

        let slow = script(&dir, "slow.sh", "exec sleep 30", "k");
        let slow = CommandProvider {
            timeout: Duration::from_millis(300),
            ..slow
        };
        let started = Instant::now();
        let error = slow.wrap(&data_key).expect_err("times out").to_string();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(error.contains("did not answer within 0.3s"), "{error}");

        let garbage = script(&dir, "garbage.sh", "cat >/dev/null; echo 'not*base64'", "k");
        let error = garbage.wrap(&data_key).expect_err("garbage").to_string();
        assert!(error.contains("stdout is not base64"), "{error}");
        let silent = script(&dir, "silent.sh", "cat >/dev/null", "k");
        let error = silent.wrap(&data_key).expect_err("empty").to_string();
        assert!(error.contains("stdout is empty"), "{error}");
        let short = script(&dir, "short.sh", "cat >/dev/null; printf c2hvcnQ=", "k");
        let error = short
            .unwrap(b"anything")
            .expect_err("short key")
            .to_string();
        assert!(error.contains("is 5 bytes, not 32"), "{error}");

        // Through the keyring, the secret is named too.
        let error = SecretKey::new(failing)
            .seal("db", &SecretValue::new("v"), 1)
            .expect_err("fails");
        assert!(matches!(error, SecretError::Provider { ref name, .. } if name == "db"));
        assert!(error.to_string().starts_with("secret `db`: "), "{error}");
    }

    #[test]
    fn commands_and_key_ids_are_checked() {
        assert!(matches!(
            CommandProvider::new("  ", "k", DEFAULT_COMMAND_TIMEOUT),
            Err(SecretKeyError::NoProgram { .. })
        ));
        for bad in ["", "-k", "a b", &"x".repeat(257)] {
            assert!(
                matches!(
                    CommandProvider::new("kms", bad, DEFAULT_COMMAND_TIMEOUT),
                    Err(SecretKeyError::BadKeyId { .. })
                ),
                "{bad}"
            );
        }
        assert!(
            CommandProvider::new(
                "kms",
                "arn:aws:kms:eu-west-1:1:key/ab-12",
                DEFAULT_COMMAND_TIMEOUT
            )
            .is_ok()
        );
    }
}
