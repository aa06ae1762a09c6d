//! Linearizability checking of key-value histories with porcupine
//! (github.com/anishathalye/porcupine), a well-kept checker, through the
//! small Go program in tools/lincheck. Used by the simulation tests, the
//! real-process tests and `causeway torture` alike.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// One operation of a history: times in any unit, as long as one history
/// uses one.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub key: String,
    pub kind: OpKind,
    pub call: i64,
    /// `None` for a write whose outcome is unknown (it failed or timed out):
    /// it may have taken effect at any time after its call.
    pub ret: Option<i64>,
}

#[derive(Clone, Debug)]
pub enum OpKind {
    Put(String),
    /// What the read returned ("" for nil).
    Get(String),
    /// A multi-key read of `keys` (the op's `key` is unused), one atomic
    /// snapshot, and what it returned.
    MultiGet {
        keys: Vec<String>,
        values: Vec<String>,
    },
}

/// True if `history` is linearizable (every key a register starting empty;
/// multi-key reads see all their keys at one instant). Panics if the check
/// cannot be made (a test must not pass without it).
pub fn check(history: &[Op]) -> bool {
    verdict(history).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether `history` is linearizable, or why that could not be decided (the
/// checker could not be built or run, or it timed out).
pub fn verdict(history: &[Op]) -> Result<bool, String> {
    let mut child =
        Command::new(binary()?).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().map_err(|e| format!("cannot run lincheck: {e}"))?;
    child.stdin.take().expect("piped").write_all(to_json(history).as_bytes()).map_err(|e| format!("lincheck input: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("lincheck: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => {
            eprintln!("{text}");
            Ok(false)
        }
        other => Err(format!("lincheck could not decide ({other:?}): {text}")),
    }
}

/// The history in lincheck's input format.
pub fn to_json(history: &[Op]) -> String {
    let mut s = String::from("[");
    for (i, op) in history.iter().enumerate() {
        let sep = if i == 0 { "" } else { ",\n" };
        let (call, ret) = (op.call, op.ret.unwrap_or(-1));
        let _ = match &op.kind {
            OpKind::Put(v) => {
                write!(s, r#"{sep}{{"client":{},"op":"put","key":{:?},"value":{v:?},"call":{call},"return":{ret}}}"#, op.client, op.key)
            }
            OpKind::Get(v) => {
                write!(s, r#"{sep}{{"client":{},"op":"get","key":{:?},"output":{v:?},"call":{call},"return":{ret}}}"#, op.client, op.key)
            }
            OpKind::MultiGet { keys, values } => write!(
                s,
                r#"{sep}{{"client":{},"op":"mget","keys":{keys:?},"outputs":{values:?},"call":{call},"return":{ret}}}"#,
                op.client
            ),
        };
    }
    s.push(']');
    s
}

/// Builds tools/lincheck once per process (it needs Go: `.ci/run`
/// installs it).
fn binary() -> Result<PathBuf, String> {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().expect("not poisoned");
    if let Some(p) = &*built {
        return Ok(p.clone());
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/lincheck");
    // Built beside the workspace's other build products, under a name of
    // this process's and renamed into place, so processes building at once
    // never see half a binary and nothing is left behind in /tmp.
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    let _ = std::fs::create_dir_all(&target);
    let out = target.join("causeway-lincheck");
    let building = target.join(format!("causeway-lincheck.{}", std::process::id()));
    let status = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&building)
        .arg(".")
        .current_dir(&dir)
        .status()
        .map_err(|e| format!("cannot build the linearizability checker in {} (is Go installed?): {e}", dir.display()))?;
    if !status.success() {
        return Err(format!("building the linearizability checker in {} failed", dir.display()));
    }
    std::fs::rename(&building, &out).map_err(|e| format!("cannot move the checker into {}: {e}", out.display()))?;
    *built = Some(out.clone());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(client: usize, value: &str, call: i64, ret: i64) -> Op {
        Op { client, key: "k".into(), kind: OpKind::Put(value.into()), call, ret: Some(ret) }
    }

    fn get(client: usize, output: &str, call: i64, ret: i64) -> Op {
        Op { client, key: "k".into(), kind: OpKind::Get(output.into()), call, ret: Some(ret) }
    }

    /// A read that starts after a write returned must see it (or something
    /// newer); one that overlaps the write may see either.
    #[test]
    fn a_stale_read_is_caught() {
        assert!(check(&[put(0, "a", 1, 2), get(1, "a", 3, 4)]));
        assert!(check(&[put(0, "a", 1, 4), get(1, "", 2, 3)]), "overlapping: either value is fine");
        assert!(!check(&[put(0, "a", 1, 2), get(1, "", 3, 4)]), "a read after the write returned the old value");
    }
}
