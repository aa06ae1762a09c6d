//! The read-back that ends a torture run: each key's last acknowledged
//! value, read at every level through every node of every site.
//!
//! A read that does not return the value is not yet a loss. Right after
//! the faults a read can fail with an error (the replicas timed out, a
//! chain is not yet whole, a node is not yet serving) or, with several
//! sites, return an older value still overtaken by one on its way from
//! another site. So a read that misses is tried again, after a short
//! pause, while the others go on, until it comes right or the read-back
//! has waited `PATIENCE` since the first miss. Then each read still
//! missing is judged by its last answer:
//!
//! * a value, other than the acknowledged one, or nil: the write is lost,
//!   whatever else happened;
//! * only errors: the site was still unavailable, and nothing read back
//!   wrong. That fails the run too, with a verdict of its own.

use super::Failure;
use crate::resp_client::RespConn;
use crate::site::Site;
use causeway_resp::Frame;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long the read-back waits, from its first miss, for every read to
/// come right.
const PATIENCE: Duration = Duration::from_secs(60);
/// Between two tries of the reads still missing.
const PAUSE: Duration = Duration::from_millis(100);
/// The longest one read may take (the nodes time requests out sooner).
const CALL: Duration = Duration::from_secs(5);
/// The levels every value is read back at.
const LEVELS: [&str; 3] = ["causal", "linearizable", "eventual"];

/// Reads every key of `acked` back through every node of `sites` at every
/// level: how it went, or the lost write or unavailable site.
pub async fn check(sites: &[Site], acked: &HashMap<String, String>) -> Result<String, Failure> {
    let mut nodes = Nodes::new(sites);
    let reads = nodes.reads(acked);
    let tally = read_back(&mut nodes, reads, PATIENCE).await;
    match (tally.judge(), tally.first_lost()) {
        (Err(Failure::Failed(lost)), Some((read, _))) => {
            // With several sites, what the node knew of the others.
            let geo = match nodes.ask(read, &[b"CW.SITES"]).await {
                Ok(Frame::Bulk(text)) => String::from_utf8_lossy(&text).replace("\r\n", " "),
                other => format!("{other:?}"),
            };
            Err(Failure::Failed(format!("{lost} (CW.SITES there: {geo})")))
        }
        (verdict, _) => verdict,
    }
}

/// One read of the read-back.
#[derive(Clone, Debug, PartialEq)]
struct Read {
    site: usize,
    node: u16,
    level: &'static str,
    key: String,
    /// The key's last acknowledged value.
    expected: String,
}

/// What one try of a read got.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// The acknowledged value.
    Expected,
    /// Something else: another value, nil, or a reply that is no value.
    Wrong(String),
    /// An error instead of a value (the replicas timed out, the node is
    /// unavailable or not serving, the connection failed).
    Failed(String),
}

/// Where the reads go: the nodes of the sites, or a script in the tests.
trait Replicas {
    async fn get(&mut self, read: &Read) -> Answer;
}

/// What the read-back came to.
#[derive(Debug, Default)]
struct ReadBack {
    /// Reads made, tries again included.
    tries: u64,
    /// Reads that missed at first and came right later.
    retried: usize,
    /// The longest a read that came right waited after its first miss.
    longest_wait: Duration,
    /// The reads that had not come right when patience ran out, each with
    /// its last answer (never `Expected`).
    missing: Vec<(Read, Answer)>,
    /// Reads not tried at all when patience ran out (only ever beside
    /// missing ones: patience runs from the first miss).
    untried: usize,
    /// How long the read-back waited (`PATIENCE`).
    patience: Duration,
}

/// A read not yet right: when it first missed, and its last answer (None
/// if not tried yet).
struct Pending {
    read: Read,
    missed: Option<(Instant, Answer)>,
}

/// Makes every read in `reads` through `replicas` until each comes right
/// or `patience` has passed since the first miss.
async fn read_back(replicas: &mut impl Replicas, reads: Vec<Read>, patience: Duration) -> ReadBack {
    let mut tally = ReadBack { patience, ..ReadBack::default() };
    let mut pending: Vec<Pending> = reads.into_iter().map(|read| Pending { read, missed: None }).collect();
    let mut deadline: Option<Instant> = None;
    let out_of_patience = |deadline: Option<Instant>| deadline.is_some_and(|d| Instant::now() >= d);
    loop {
        let mut missing = Vec::new();
        let mut left = pending.into_iter();
        for mut p in left.by_ref() {
            if out_of_patience(deadline) {
                missing.push(p);
                break;
            }
            tally.tries += 1;
            match replicas.get(&p.read).await {
                Answer::Expected => {
                    if let Some((since, _)) = p.missed {
                        tally.retried += 1;
                        tally.longest_wait = tally.longest_wait.max(since.elapsed());
                    }
                }
                answer => {
                    let now = Instant::now();
                    deadline.get_or_insert(now + patience);
                    p.missed = Some((p.missed.map_or(now, |(since, _)| since), answer));
                    missing.push(p);
                }
            }
        }
        missing.extend(left);
        pending = missing;
        if pending.is_empty() || out_of_patience(deadline) {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    for p in pending {
        match p.missed {
            Some((_, last)) => tally.missing.push((p.read, last)),
            None => tally.untried += 1,
        }
    }
    tally
}

impl ReadBack {
    /// The verdict: what to report if every read came right, else a lost
    /// write (some read's last answer was a value, and the wrong one) or an
    /// unavailable site (reads still failing with errors, none wrong).
    fn judge(&self) -> Result<String, Failure> {
        let failing = self.missing.iter().filter(|(_, a)| matches!(a, Answer::Failed(_))).count();
        if let Some((read, Answer::Wrong(got))) = self.first_lost() {
            return Err(Failure::Failed(format!(
                "acknowledged write lost: {} GET {} through site {} node {} returned {got}, expected {:?}, still after {} s ({} reads came back wrong or missing, {failing} still failed with errors)",
                read.level,
                read.key,
                read.site,
                read.node,
                read.expected,
                self.patience.as_secs(),
                self.missing.len() - failing
            )));
        }
        if let Some((read, Answer::Failed(error))) = self.missing.first() {
            return Err(Failure::Unavailable(format!(
                "site unavailable: {failing} reads still failing after {} s ({} more not tried), the first: {} GET {} through site {} node {}: {error}; nothing read back wrong",
                self.patience.as_secs(),
                self.untried,
                read.level,
                read.key,
                read.site,
                read.node
            )));
        }
        Ok(match self.retried {
            0 => format!("{} reads, 0 lost, every one right the first time", self.tries),
            n => format!(
                "{} reads, 0 lost; {n} right only when tried again, the longest after {:.2} s",
                self.tries,
                self.longest_wait.as_secs_f64()
            ),
        })
    }

    /// The first read whose last answer was a wrong value, if any.
    fn first_lost(&self) -> Option<&(Read, Answer)> {
        self.missing.iter().find(|(_, a)| matches!(a, Answer::Wrong(_)))
    }
}

/// Every node of `sites`, one connection per node and level, opened when
/// first needed and again after it failed.
struct Nodes<'a> {
    sites: &'a [Site],
    open: HashMap<(usize, u16, &'static str), RespConn>,
}

impl<'a> Nodes<'a> {
    fn new(sites: &'a [Site]) -> Self {
        Nodes { sites, open: HashMap::new() }
    }

    /// Every key of `acked` at every level through every node of every
    /// site, node by node.
    fn reads(&self, acked: &HashMap<String, String>) -> Vec<Read> {
        let mut reads = Vec::new();
        for (site, s) in self.sites.iter().enumerate() {
            for node in 0..s.shape.nodes {
                for level in LEVELS {
                    reads.extend(acked.iter().map(|(key, expected)| Read {
                        site,
                        node,
                        level,
                        key: key.clone(),
                        expected: expected.clone(),
                    }));
                }
            }
        }
        reads
    }

    /// `command` through the node `read` went to, on a fresh connection.
    async fn ask(&self, read: &Read, command: &[&[u8]]) -> Result<Frame, String> {
        let mut c = RespConn::connect(&self.sites[read.site].addr(read.node)).await?;
        c.call(command).await
    }
}

impl Replicas for Nodes<'_> {
    async fn get(&mut self, read: &Read) -> Answer {
        let at = (read.site, read.node, read.level);
        let addr = self.sites[read.site].addr(read.node);
        let open = &mut self.open;
        let answer = tokio::time::timeout(CALL, async {
            let c = match open.entry(at) {
                Entry::Occupied(c) => c.into_mut(),
                Entry::Vacant(slot) => {
                    let mut c = RespConn::connect(&addr).await?;
                    c.call(&[b"CW.CONSISTENCY", read.level.as_bytes()]).await?;
                    slot.insert(c)
                }
            };
            c.call(&[b"GET", read.key.as_bytes()]).await
        })
        .await;
        match answer {
            Ok(Ok(Frame::Bulk(v))) if v == read.expected.as_bytes() => Answer::Expected,
            Ok(Ok(Frame::Bulk(v))) => Answer::Wrong(format!("{:?}", String::from_utf8_lossy(&v))),
            Ok(Ok(Frame::Null)) => Answer::Wrong("nil".into()),
            Ok(Ok(other)) => Answer::Wrong(format!("{other:?}")),
            Ok(Err(e)) => {
                // The connection may be broken, or mid-reply: a new one.
                self.open.remove(&at);
                Answer::Failed(e)
            }
            Err(_) => {
                self.open.remove(&at);
                Answer::Failed(format!("no answer in {} s", CALL.as_secs()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(key: &str) -> Read {
        Read { site: 0, node: 1, level: "linearizable", key: key.into(), expected: format!("{key}:v7") }
    }

    /// Answers each key from a script, one answer per try, the last one
    /// for every try after.
    struct Script(HashMap<String, Vec<Answer>>);

    impl Replicas for Script {
        async fn get(&mut self, read: &Read) -> Answer {
            let answers = self.0.get_mut(&read.key).expect("scripted");
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        }
    }

    fn script(answers: &[(&str, &[Answer])]) -> Script {
        Script(answers.iter().map(|(k, a)| (k.to_string(), a.to_vec())).collect())
    }

    fn run(replicas: &mut Script, reads: Vec<Read>, patience: Duration) -> ReadBack {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(read_back(replicas, reads, patience))
    }

    fn timed_out() -> Answer {
        Answer::Failed("ERR timed out waiting for the replicas".into())
    }

    /// The run that once ended "acknowledged write lost": a linearizable
    /// read timed out right after the faults. Tried again, it comes right.
    #[test]
    fn a_read_that_timed_out_is_tried_again_until_it_comes_right() {
        let mut replicas = script(&[("a", &[Answer::Expected]), ("b", &[timed_out(), timed_out(), Answer::Expected])]);
        let tally = run(&mut replicas, vec![read("a"), read("b")], Duration::from_secs(3600));
        assert_eq!((tally.tries, tally.retried, tally.missing.len()), (4, 1, 0), "{tally:?}");
        let said = tally.judge().unwrap();
        assert!(said.starts_with("4 reads, 0 lost; 1 right only when tried again, the longest after "), "{said}");
    }

    #[test]
    fn reads_that_keep_failing_are_an_unavailable_site_not_a_loss() {
        let mut replicas = script(&[("a", &[Answer::Expected]), ("b", &[timed_out()]), ("c", &[Answer::Failed("ERR unavailable".into())])]);
        let tally = run(&mut replicas, vec![read("a"), read("b"), read("c")], Duration::ZERO);
        assert_eq!(tally.missing, vec![(read("b"), timed_out())], "patience ran out at the first miss: c is never tried");
        assert_eq!(tally.untried, 1);
        let Err(Failure::Unavailable(said)) = tally.judge() else { panic!("{:?}", tally.judge()) };
        assert!(said.starts_with("site unavailable: 1 reads still failing after 0 s (1 more not tried)"), "{said}");
        assert!(said.contains("linearizable GET b through site 0 node 1: ERR timed out"), "{said}");
    }

    #[test]
    fn a_wrong_value_is_a_loss_even_beside_failing_reads() {
        let mut replicas = script(&[("a", &[timed_out()]), ("b", &[Answer::Wrong("nil".into())])]);
        let tally = run(&mut replicas, vec![read("a"), read("b")], Duration::from_millis(300));
        let Err(Failure::Failed(said)) = tally.judge() else { panic!("{:?}", tally.judge()) };
        assert!(said.starts_with("acknowledged write lost: linearizable GET b through site 0 node 1 returned nil"), "{said}");
        assert!(said.contains("(1 reads came back wrong or missing, 1 still failed with errors)"), "{said}");
    }

    /// The verdict alone, from outcomes given whole.
    #[test]
    fn the_verdict_tells_loss_from_unavailability() {
        let tally = |missing: Vec<(Read, Answer)>| ReadBack { missing, patience: PATIENCE, ..ReadBack::default() };
        assert_eq!(tally(Vec::new()).judge().unwrap(), "0 reads, 0 lost, every one right the first time");
        let unavailable = tally(vec![(read("a"), timed_out()), (read("b"), Answer::Failed("server closed the connection".into()))]);
        let Err(Failure::Unavailable(said)) = unavailable.judge() else { panic!() };
        assert!(said.starts_with("site unavailable: 2 reads still failing after 60 s"), "{said}");
        let lost = tally(vec![(read("a"), Answer::Wrong("\"a:v6\"".into()))]);
        let Err(Failure::Failed(said)) = lost.judge() else { panic!() };
        assert!(said.contains("returned \"a:v6\", expected \"a:v7\", still after 60 s"), "{said}");
    }
}
