//! Instance output: [`LogStream`] (what `Runtime::logs` returns), and the
//! rotated log files of the process runtime — `output.log` plus up to
//! [`KEPT_OLD_FILES`] older copies — with tail reading, following across
//! rotations, and copy-truncate rotation.
//!
//! Why copy-truncate: the workload writes to `output.log` through its own
//! O_APPEND descriptor, not through a pipe to the agent, so it keeps running
//! (and logging) while the agent is restarted. Renaming the file would leave
//! the workload writing to the renamed inode, so rotation copies the file to
//! `output.log.1` and truncates it in place; the few bytes written between
//! the copy and the truncation are lost (as with logrotate's `copytruncate`).

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::{Error, Operation, Result};

/// The current log file of an instance directory.
pub(crate) const LOG_FILE: &str = "output.log";
/// How many rotated copies are kept (`output.log.1` is the newest).
pub(crate) const KEPT_OLD_FILES: usize = 2;
/// How often a follower looks for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Which lines `logs` returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogOptions {
    /// Only the last this many lines (of everything kept); `None`: all.
    pub tail: Option<usize>,
    /// Keep streaming new lines until the instance exits.
    pub follow: bool,
}

/// A stream of output lines; ends when everything asked for was delivered.
/// Dropping it stops a follower.
#[derive(Debug)]
pub struct LogStream {
    lines: mpsc::Receiver<Result<String>>,
}

impl LogStream {
    /// A stream fed by a producer task through a channel.
    pub fn from_channel(lines: mpsc::Receiver<Result<String>>) -> Self {
        Self { lines }
    }

    /// A finished stream of known lines (for fakes and simulations).
    pub fn from_lines(lines: impl IntoIterator<Item = String>) -> Self {
        let lines: Vec<String> = lines.into_iter().collect();
        let (sender, receiver) = mpsc::channel(lines.len().max(1));
        for line in lines {
            // Cannot fail: the channel has room for every line.
            let _ = sender.try_send(Ok(line));
        }
        Self::from_channel(receiver)
    }

    /// The next line; `None` at the end of the stream.
    pub async fn next_line(&mut self) -> Option<Result<String>> {
        self.lines.recv().await
    }

    /// Every remaining line (do not use on a following stream of a running
    /// instance: it ends only when the instance does).
    pub async fn collect(mut self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        while let Some(line) = self.next_line().await {
            lines.push(line?);
        }
        Ok(lines)
    }
}

/// `output.log` and its rotated copies, oldest first.
pub(crate) fn log_files_oldest_first(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=KEPT_OLD_FILES)
        .rev()
        .map(|n| dir.join(format!("{LOG_FILE}.{n}")))
        .collect();
    files.push(dir.join(LOG_FILE));
    files
}

/// Rotates `dir/output.log` when it is larger than `limit` bytes.
/// Returns whether it rotated.
pub(crate) fn rotate_if_needed(dir: &Path, limit: u64) -> std::io::Result<bool> {
    let current = dir.join(LOG_FILE);
    let size = match std::fs::metadata(&current) {
        Ok(metadata) => metadata.len(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    if size <= limit {
        return Ok(false);
    }
    for n in (1..KEPT_OLD_FILES).rev() {
        let older = dir.join(format!("{LOG_FILE}.{n}"));
        if older.exists() {
            std::fs::rename(&older, dir.join(format!("{LOG_FILE}.{}", n + 1)))?;
        }
    }
    std::fs::copy(&current, dir.join(format!("{LOG_FILE}.1")))?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&current)?
        .set_len(0)?;
    Ok(true)
}

/// The last `count` lines over all kept files, and the size of the current
/// file they were read up to (where a follower continues).
pub(crate) fn read_tail(dir: &Path, count: Option<usize>) -> std::io::Result<(Vec<String>, u64)> {
    let mut lines = VecDeque::new();
    let mut current_size = 0;
    let files = log_files_oldest_first(dir);
    // Newest file first, so older files are read only when needed.
    for (index, path) in files.iter().enumerate().rev() {
        let is_current = index == files.len() - 1;
        let Some((bytes, size)) = read_file_end(path, count.map(|n| n - lines.len().min(n)))?
        else {
            continue;
        };
        if is_current {
            current_size = size;
        }
        let mut file_lines = split_lines(&bytes);
        // A rotated file may end mid-line; the current file's partial last
        // line is shown too (a follower would otherwise wait for its end).
        while let Some(line) = file_lines.pop() {
            if count.is_some_and(|n| lines.len() >= n) {
                break;
            }
            lines.push_front(line);
        }
        if count.is_some_and(|n| lines.len() >= n) {
            break;
        }
    }
    Ok((lines.into(), current_size))
}

/// The bytes of a file holding (at least) its last `lines` lines, and its
/// size; `None` when it does not exist.
fn read_file_end(path: &Path, lines: Option<usize>) -> std::io::Result<Option<(Vec<u8>, u64)>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let size = file.metadata()?.len();
    let Some(wanted) = lines else {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        return Ok(Some((bytes, size)));
    };
    // Read backwards in blocks until enough line ends are in hand.
    const BLOCK: u64 = 64 * 1024;
    let mut start = size;
    let mut bytes = Vec::new();
    while start > 0 && bytecount_newlines(&bytes) <= wanted {
        let from = start.saturating_sub(BLOCK);
        let mut block = vec![0; usize::try_from(start - from).unwrap_or(0)];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut block)?;
        block.extend_from_slice(&bytes);
        bytes = block;
        start = from;
    }
    Ok(Some((bytes, size)))
}

fn bytecount_newlines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

/// Lines of a byte buffer, lossily decoded, the trailing partial line
/// included.
fn split_lines(bytes: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = bytes
        .split(|&b| b == b'\n')
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .collect();
    if bytes.ends_with(b"\n") || bytes.is_empty() {
        lines.pop();
    }
    lines
}

/// The last `options.tail` lines of instance `id`'s log in `dir`, then (with
/// `options.follow`) what is appended until `is_running` says it ended —
/// the `logs` of every runtime that keeps `output.log` files.
pub(crate) async fn stream(
    id: &str,
    dir: PathBuf,
    options: LogOptions,
    is_running: impl Fn() -> bool + Send + 'static,
) -> Result<LogStream> {
    let reading = dir.clone();
    let (lines, offset) = tokio::task::spawn_blocking(move || read_tail(&reading, options.tail))
        .await
        .map_err(std::io::Error::other)
        .and_then(|read| read)
        .map_err(|e| Error::io(id, Operation::Logs, "reading output.log", e))?;
    let (sender, receiver) = mpsc::channel(256);
    tokio::spawn(async move {
        for line in lines {
            if sender.send(Ok(line)).await.is_err() {
                return;
            }
        }
        if options.follow {
            follow(dir, offset, is_running, sender).await;
        }
    });
    Ok(LogStream::from_channel(receiver))
}

/// Streams lines appended to `dir/output.log` from `offset` on, across
/// rotations, until `is_running` says the instance ended and the file is
/// drained, or the receiver is dropped.
pub(crate) async fn follow(
    dir: PathBuf,
    mut offset: u64,
    is_running: impl Fn() -> bool + Send + 'static,
    lines: mpsc::Sender<Result<String>>,
) {
    let mut partial = Vec::new();
    loop {
        let running = is_running();
        let chunk = match read_appended(&dir, &mut offset) {
            Ok(chunk) => chunk,
            Err(error) => {
                tracing::debug!(dir = %dir.display(), %error, "log follower stops");
                return;
            }
        };
        partial.extend_from_slice(&chunk);
        if let Some(last_newline) = partial.iter().rposition(|&b| b == b'\n') {
            let rest = partial.split_off(last_newline + 1);
            for line in split_lines(&partial) {
                if lines.send(Ok(line)).await.is_err() {
                    return;
                }
            }
            partial = rest;
        }
        if !running {
            if !partial.is_empty() {
                let _ = lines
                    .send(Ok(String::from_utf8_lossy(&partial).into_owned()))
                    .await;
            }
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_POLL) => {}
            () = lines.closed() => return,
        }
    }
}

/// Bytes appended since `offset`. When the file shrank it was rotated: the
/// rest of what we had not read is at the same offset in `output.log.1`.
fn read_appended(dir: &Path, offset: &mut u64) -> std::io::Result<Vec<u8>> {
    let current = dir.join(LOG_FILE);
    let size = std::fs::metadata(&current).map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    if size < *offset {
        bytes = read_from(&dir.join(format!("{LOG_FILE}.1")), *offset)?;
        *offset = 0;
    }
    let appended = read_from(&current, *offset)?;
    *offset += appended.len() as u64;
    bytes.extend_from_slice(&appended);
    Ok(bytes)
}

fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).expect("write log file");
    }

    #[test]
    fn tail_reaches_into_rotated_files_only_when_needed() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "output.log.2", "a\nb\n");
        write(dir.path(), "output.log.1", "c\nd\n");
        write(dir.path(), "output.log", "e\nf");
        let (lines, size) = read_tail(dir.path(), Some(3)).expect("tail");
        assert_eq!(lines, ["d", "e", "f"]);
        assert_eq!(size, 3);
        let (all, _) = read_tail(dir.path(), None).expect("all");
        assert_eq!(all, ["a", "b", "c", "d", "e", "f"]);
        let (none, _) = read_tail(dir.path(), Some(0)).expect("zero");
        assert!(none.is_empty());
    }

    #[test]
    fn tail_of_a_large_file_reads_across_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text: String = (0..20_000).map(|i| format!("line {i:08}\n")).collect();
        write(dir.path(), "output.log", &text);
        let (lines, _) = read_tail(dir.path(), Some(10_000)).expect("tail");
        assert_eq!(lines.len(), 10_000);
        assert_eq!(lines[0], "line 00010000");
        assert_eq!(lines[9_999], "line 00019999");
    }

    #[test]
    fn rotation_keeps_two_old_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        for round in 0..4 {
            write(
                dir.path(),
                "output.log",
                &format!("round {round} {}\n", "x".repeat(2000)),
            );
            assert!(rotate_if_needed(dir.path(), 1024).expect("rotate"));
        }
        assert!(!rotate_if_needed(dir.path(), 1024).expect("nothing to rotate"));
        assert_eq!(
            std::fs::metadata(dir.path().join("output.log"))
                .expect("log")
                .len(),
            0
        );
        let newest = std::fs::read_to_string(dir.path().join("output.log.1")).expect(".1");
        assert!(newest.starts_with("round 3"));
        let older = std::fs::read_to_string(dir.path().join("output.log.2")).expect(".2");
        assert!(older.starts_with("round 2"));
        assert!(!dir.path().join("output.log.3").exists());
    }

    #[tokio::test]
    async fn a_follower_continues_across_a_rotation() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "output.log", "one\ntw");
        let mut offset = 0;
        let first = read_appended(dir.path(), &mut offset).expect("read");
        assert_eq!(first, b"one\ntw");
        write(dir.path(), "output.log", "one\ntwo\nthree\n");
        rotate_if_needed(dir.path(), 4).expect("rotate");
        write(dir.path(), "output.log", "four\n");
        let rest = read_appended(dir.path(), &mut offset).expect("read");
        assert_eq!(rest, b"o\nthree\nfour\n");
    }

    #[tokio::test]
    async fn a_follower_of_an_ended_instance_drains_and_stops() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "output.log", "a\nb\nlast words");
        let (sender, receiver) = mpsc::channel(8);
        follow(dir.path().to_owned(), 2, || false, sender).await;
        let lines = LogStream::from_channel(receiver)
            .collect()
            .await
            .expect("lines");
        assert_eq!(lines, ["b", "last words"]);
    }
}
