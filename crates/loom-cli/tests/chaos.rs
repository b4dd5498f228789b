//! The chaos test: a run whose irreversible (but idempotent) tool appends one line to a file
//! is killed with SIGKILL at random points — before, during and after the tool call, during
//! journal writes — then resumed (and sometimes killed again) until it completes. Every trial
//! must end with the run completed, exactly one line written and a journal that reads back.
//!
//! CI runs a short version; `bench/chaos.sh` runs `CHAOS_TRIALS=1000` (or more).
//!
//! Beside it, a deterministic case: the reference's own journal cut right after `tool.called`
//! (a worker killed mid-call, its lease run out), resumed with `resume` (of the `devis`
//! binary), whose first events must be the reference's.
//!
//! **Replaying a failure.** The kill points come from a generator seeded per run: the test
//! prints its seed on stderr when it starts (`chaos: 25 trial(s), seed 1234…`, past the
//! harness's capture, so it shows even if the run hangs or is killed), and every failure
//! repeats it. `CHAOS_SEED=<seed> cargo test -p loom-cli --test chaos` replays the same
//! sequence of kill delays (a kill still lands wherever the process is at that moment, so a
//! replay reproduces the schedule, not the exact interleaving). A `CHAOS_SEED` that is not a
//! whole number above 0 is refused rather than replaced by a random seed.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    io::Write,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

/// A small deterministic generator (xorshift), seeded per run and printed, so a failing
/// sequence can be replayed with `CHAOS_SEED` (never 0: xorshift would stay at 0).
struct Rng(u64);

/// The seed `CHAOS_SEED` asks for: `None` when unset, an error when it is not a whole number
/// above 0.
fn requested_seed(value: Option<&str>) -> Result<Option<u64>, String> {
    let Some(text) = value else {
        return Ok(None);
    };
    match text.trim().parse::<u64>() {
        Ok(0) => Err("CHAOS_SEED must not be 0 (the generator would only give 0)".to_owned()),
        Ok(seed) => Ok(Some(seed)),
        Err(_) => Err(format!(
            "CHAOS_SEED={text:?} is not a whole number: give the seed a failed run printed"
        )),
    }
}

/// The seed of this run: `CHAOS_SEED`, else one from the clock (odd, so never 0).
fn seed() -> u64 {
    let requested = std::env::var("CHAOS_SEED").ok();
    match requested_seed(requested.as_deref()) {
        Ok(Some(seed)) => seed,
        Ok(None) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        }
        Err(message) => panic!("{message}"),
    }
}

#[test]
fn a_chaos_seed_is_read_or_refused() {
    assert_eq!(requested_seed(None), Ok(None));
    assert_eq!(
        requested_seed(Some("1795966376693088005")),
        Ok(Some(1795966376693088005))
    );
    assert!(
        requested_seed(Some("0"))
            .unwrap_err()
            .contains("must not be 0")
    );
    assert!(
        requested_seed(Some("abc"))
            .unwrap_err()
            .contains("\"abc\" is not a whole number")
    );
}

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Outcome {
    kills: u32,
    lines: usize,
    completed: bool,
}

fn command(dir: &Path, file: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(example_bin("chaos"));
    command
        .current_dir(dir)
        .env("CHAOS_FILE", file)
        .args(["--config", "loom.yaml"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Starts `args`, kills it after `kill_after` if given, and returns (exit code, stderr).
fn attempt(
    dir: &Path,
    file: &Path,
    args: &[&str],
    kill_after: Option<Duration>,
) -> (Option<i32>, String, bool) {
    let mut child = command(dir, file, args).spawn().unwrap();
    let mut killed = false;
    if let Some(delay) = kill_after {
        thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
            killed = true;
        }
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        killed,
    )
}

/// One trial; `replay` (the seed and how to replay it) ends every failure message.
fn trial(dir: &Path, index: usize, rng: &mut Rng, replay: &str) -> Outcome {
    let run_id = format!("t{index}");
    let file = dir.join(format!("out-{index}.txt"));
    let mut kills = 0;
    // The first process is killed somewhere in its life (a run takes a few milliseconds).
    let (_, _, killed) = attempt(
        dir,
        &file,
        &["run", "chaos", "go", "--run-id", &run_id],
        Some(Duration::from_micros(rng.below(25_000))),
    );
    kills += u32::from(killed);
    let mut completed = false;
    for round in 0..200 {
        // Sometimes the resuming process is killed too.
        let kill =
            (round < 3 && rng.below(2) == 0).then(|| Duration::from_micros(rng.below(20_000)));
        let (code, stderr, killed) = attempt(dir, &file, &["resume", &run_id], kill);
        kills += u32::from(killed);
        match code {
            Some(0) => {
                completed = true;
                break;
            }
            _ if killed => {}
            Some(2) if stderr.contains("not found") => {
                // Killed before the run was journaled: start it again.
                let (code, _, _) = attempt(
                    dir,
                    &file,
                    &["run", "chaos", "go", "--run-id", &run_id],
                    None,
                );
                if code == Some(0) {
                    completed = true;
                    break;
                }
            }
            // The killed driver's lease has not run out yet.
            Some(2) if stderr.contains("driven elsewhere") => {
                thread::sleep(Duration::from_millis(100))
            }
            other => panic!("trial {index}: resume ended with {other:?}: {stderr}\n{replay}"),
        }
    }
    let lines = fs::read_to_string(&file)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    // The journal reads back cleanly and says the run completed.
    let (code, stderr, _) = attempt(dir, &file, &["inspect", &run_id, "--json"], None);
    assert_eq!(
        code,
        Some(0),
        "trial {index}: inspect failed: {stderr}\n{replay}"
    );
    Outcome {
        kills,
        lines,
        completed,
    }
}

#[test]
fn killed_runs_resume_to_exactly_one_effect() {
    let trials: usize = std::env::var("CHAOS_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    let seed = seed();
    let replay = format!("chaos seed {seed}: replay with CHAOS_SEED={seed}");
    // Straight to stderr in one write, past the harness's capture: shown even if the run hangs.
    let started = format!(
        "chaos: {trials} trial(s), seed {seed} (replay: CHAOS_SEED={seed} cargo test -p \
         loom-cli --test chaos)\n"
    );
    let _ = std::io::stderr().write_all(started.as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/chaos");
    fs::copy(source.join("loom.yaml"), dir.path().join("loom.yaml")).unwrap();
    fs::create_dir_all(dir.path().join("agents")).unwrap();
    fs::copy(
        source.join("agents/chaos.yaml"),
        dir.path().join("agents/chaos.yaml"),
    )
    .unwrap();
    let mut rng = Rng(seed);
    let (mut kills, mut duplicates, mut lost) = (0, 0, 0);
    for index in 0..trials {
        let outcome = trial(dir.path(), index, &mut rng, &replay);
        kills += outcome.kills;
        if outcome.lines > 1 {
            duplicates += 1;
        }
        if !outcome.completed || outcome.lines == 0 {
            lost += 1;
        }
    }
    eprintln!(
        "chaos: {trials} trial(s), {kills} kill(s), {duplicates} duplicate(s), {lost} lost run(s)"
    );
    assert_eq!((duplicates, lost), (0, 0), "{replay}");
}

/// The reference's plain run (`plain-run.jsonl`) cut right after its `tool.called`, as a worker
/// killed mid-call leaves it, its lease long run out; the agent and tool renamed to the
/// `devis` example's. `None` on a clone without `../shared`.
fn abandoned_mid_call() -> Option<String> {
    let text = loom_testkit::shared::text("reference/journals/plain-run.jsonl")?;
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut line = line
            .replace("\"agent\":\"demo\"", "\"agent\":\"devis\"")
            .replace("calculer", "prix_ttc")
            .replace(
                "{\"expr\":\"12*7+3\"}",
                "{\"montant_ht\":1250,\"taux_tva\":10}",
            );
        if let Some(at) = line.find("\"lease_until\":\"") {
            let start = at + "\"lease_until\":\"".len();
            let end = start + line[start..].find('"').unwrap();
            line.replace_range(start..end, "2001-01-01T00:00:00.000000Z");
        }
        let called = line.contains("\"type\":\"tool.called\"");
        lines.push(line);
        if called {
            break;
        }
    }
    Some(lines.join("\n") + "\n")
}

/// The types of the events `devis resume` writes for the abandoned run, `prix_ttc` declared
/// with `side_effects`.
fn resumed_types(journal: &str, side_effects: &str) -> Vec<String> {
    let dir = copy_example("devis");
    let agent = dir.path().join("agents/devis.yaml");
    let declared = fs::read_to_string(&agent).unwrap().replace(
        "side_effects: none",
        &format!("side_effects: {side_effects}"),
    );
    fs::write(&agent, declared).unwrap();
    let file = dir.path().join("data/default/plain-run-1.jsonl");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, journal).unwrap();
    let out = Command::new(devis_bin())
        .current_dir(dir.path())
        .args(["--config", "loom.yaml", "resume", "plain-run-1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let before = journal.lines().count();
    let events: Vec<serde_json::Value> = fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    events[before..]
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// Resumed after its killed worker's lease ran out, the run's first events are the
/// reference's: its claim, the step, then the interrupted call's outcome (run again when the
/// tool is safe, `UNKNOWN_STATE` when it is not), with no other claim.
#[test]
fn a_run_abandoned_mid_call_resumes_with_the_reference_events() {
    let Some(journal) = abandoned_mid_call() else {
        return;
    };
    let rerun = resumed_types(&journal, "none");
    let unknown = resumed_types(&journal, "irreversible");
    for types in [&rerun, &unknown] {
        assert_eq!(types[..2], ["run.claimed", "step.started"], "{types:?}");
        assert_eq!(
            types.iter().filter(|t| *t == "run.claimed").count(),
            1,
            "{types:?}"
        );
    }
    insta::assert_json_snapshot!(
        "abandoned_mid_call_resumed",
        serde_json::json!({"safe tool (run again)": rerun, "unsafe tool (unknown state)": unknown})
    );
}
