//! The repository analyzer: jobs of 30 s to 10+ minutes that report their stages
//! (`clone → count → report`) as progress.
//!
//! Workers are `jobwarden run` processes ("pods") with an `exec` handler: a script that
//! prints a JSON progress line every quarter second. Three things are measured:
//!
//! 1. A job that runs far longer than `stale_after` but reports progress is never
//!    reclaimed: one attempt, no `stale` entry in its history.
//! 2. A pod killed with SIGKILL and restarted under the same name takes its job back at once
//!    (start-up reconciliation proves the old process is gone): seconds.
//! 3. A pod killed and gone for good: another pod's heartbeat reaper takes its job back once
//!    its heartbeat is `dead_after` old.
//!
//! Each taken-back attempt leaves its reason in `job_attempts` (`restarted`, `owner_dead`),
//! shown by `jobwarden jobs show`. Used by `cargo run --example repo_analyzer` and
//! `tests/scenarios.rs`, with durations scaled down (see `Settings`).

#[path = "../common/pod.rs"]
mod pod;

use jobwarden::store::Store;
use pod::Pod;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Settings {
    pub jobwarden: PathBuf,
    pub database_url: String,
    pub nats_url: String,
    pub schema: String,
    /// How long the long job runs (its stages split it in three).
    pub long_job: Duration,
    /// The queue's stale_after: a job silent this long is taken back.
    pub stale_after: Duration,
    /// worker.dead_after: a pod silent this long is dead.
    pub dead_after: Duration,
    pub log_dir: PathBuf,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// The long job: attempts, progress reports seen, stages seen, reclaimed.
    pub long_job_seconds: f64,
    pub long_job_attempts: i32,
    pub long_job_stages: Vec<String>,
    pub long_job_stale_entries: i64,
    /// Kill → the job running again, pod restarted under the same name.
    pub restarted_recovery_seconds: f64,
    /// Kill → the job running again on another pod, the killed pod gone.
    pub gone_recovery_seconds: f64,
    pub dead_after_seconds: f64,
    /// The trail: each job's attempt outcomes, in order.
    pub restarted_trail: Vec<String>,
    pub gone_trail: Vec<String>,
    /// `jobwarden jobs show` of the job whose pod was gone.
    pub jobs_show: String,
    pub all_completed: bool,
}

/// The analysis: clone, count, report, with a progress line every quarter second. Stops by
/// itself when its worker is gone (so a killed pod leaves no orphan running).
const ANALYZE: &str = r#"
payload=$(cat)
secs=$(printf '%s' "$payload" | sed -n 's/.*"seconds": *\([0-9]*\).*/\1/p')
[ -n "$secs" ] || secs=10
steps=$((secs * 4))
i=0
while [ "$i" -lt "$steps" ]; do
  kill -0 "$PPID" 2>/dev/null || exit 1
  if [ "$i" -lt $((steps / 3)) ]; then stage=clone
  elif [ "$i" -lt $((2 * steps / 3)) ]; then stage=count
  else stage=report; fi
  p=$((i * 100 / steps))
  printf '{"stage":"%s","progress":%d.%02d,"message":"%s %d%%"}\n' "$stage" $((p / 100)) $((p % 100)) "$stage" "$p"
  sleep 0.25
  i=$((i + 1))
done
printf '{"result":{"files":%d}}\n' $((secs * 137))
"#;

async fn status(
    store: &Store,
    id: &str,
) -> anyhow::Result<(String, i32, Option<String>, Option<String>)> {
    let j = store
        .job_get(id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no job {id}"))?;
    Ok((j.status, j.attempts, j.worker_id, j.stage))
}

/// Waits until `cond` holds for job `id`'s (status, attempts, worker, stage).
async fn wait_for(
    store: &Store,
    id: &str,
    limit: Duration,
    cond: impl Fn(&(String, i32, Option<String>, Option<String>)) -> bool,
) -> anyhow::Result<(String, i32, Option<String>, Option<String>)> {
    let until = Instant::now() + limit;
    loop {
        let s = status(store, id).await?;
        if cond(&s) {
            return Ok(s);
        }
        anyhow::ensure!(
            Instant::now() < until,
            "job {id} is still {s:?} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn trail(store: &Store, id: &str) -> anyhow::Result<Vec<String>> {
    Ok(store
        .job_attempts(id)
        .await?
        .into_iter()
        .map(|a| a.outcome)
        .collect())
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

pub async fn run(s: &Settings) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&s.log_dir)?;
    let (store, broker) = pod::connect(&s.database_url, &s.schema, &s.nats_url).await?;
    let client = jobwarden::client::Client::new(store.clone(), broker);
    let heartbeat = s.dead_after / 5;
    let config = s.log_dir.join("jobwarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = {:?}\nschema = {:?}\npool_size = 4\n[nats]\nurl = {:?}\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\n\
             heartbeat_every = {:?}\ndead_after = {:?}\nsweep_every = \"1s\"\n\
             [queues.analyze]\nconcurrency = 2\nmax_attempts = 5\ntimeout = \"30m\"\n\
             stale_after = {:?}\n\
             handler = {{ kind = \"exec\", command = [\"sh\", \"-c\", {:?}] }}\n",
            s.database_url,
            s.schema,
            s.nats_url,
            secs(heartbeat),
            secs(s.dead_after),
            secs(s.stale_after),
            ANALYZE
        ),
    )?;
    let start = |name: &str| Pod::start(&s.jobwarden, &config, &s.log_dir, name);
    let enqueue = |id: &str, seconds: u64| {
        let client = client.clone();
        let id = id.to_string();
        async move {
            client
                .enqueue(
                    "analyze",
                    json!({"repo": format!("https://git.example.com/{id}.git"), "seconds": seconds}),
                    jobwarden::client::EnqueueOptions {
                        id: Some(id),
                        ..Default::default()
                    },
                )
                .await
        }
    };
    let mut report = Report {
        dead_after_seconds: s.dead_after.as_secs_f64(),
        ..Report::default()
    };

    // 1. The long job, reporting its stages, outlives stale_after many times over.
    let mut pod0 = start("analyzer-0")?;
    let began = Instant::now();
    enqueue("repo-long", s.long_job.as_secs().max(1)).await?;
    let mut stages: Vec<String> = Vec::new();
    loop {
        let (st, _, _, stage) = status(&store, "repo-long").await?;
        if let Some(stage) = stage {
            if stages.last() != Some(&stage) {
                stages.push(stage);
            }
        }
        if st == "completed" || st == "dead" || began.elapsed() > s.long_job * 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report.long_job_seconds = began.elapsed().as_secs_f64();
    report.long_job_stages = stages;
    report.long_job_attempts = status(&store, "repo-long").await?.1;
    report.long_job_stale_entries = store
        .raw()
        .await?
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE job_id = 'repo-long' AND outcome <> 'completed'",
            &[],
        )
        .await?
        .get(0);

    // 2. The pod running a job is killed and comes back under its name.
    enqueue("repo-restarted", 600).await?;
    wait_for(&store, "repo-restarted", Duration::from_secs(30), |s| {
        s.0 == "processing" && s.3.is_some()
    })
    .await?;
    pod0.kill9();
    let killed = Instant::now();
    pod0.restart()?;
    wait_for(&store, "repo-restarted", Duration::from_secs(60), |s| {
        s.0 == "processing" && s.1 == 2
    })
    .await?;
    report.restarted_recovery_seconds = killed.elapsed().as_secs_f64();
    report.restarted_trail = trail(&store, "repo-restarted").await?;
    store.job_cancel("repo-restarted").await?;

    // 3. The pod running a job is killed for good; the others take the job back.
    let mut pod1 = start("analyzer-1")?;
    let mut pod2 = start("analyzer-2")?;
    enqueue("repo-gone", 600).await?;
    let (_, _, owner, _) = wait_for(&store, "repo-gone", Duration::from_secs(30), |s| {
        s.0 == "processing" && s.3.is_some()
    })
    .await?;
    let owner = owner.unwrap_or_default();
    {
        let mut pods = [&mut pod0, &mut pod1, &mut pod2];
        let victim = pods
            .iter_mut()
            .find(|p| owner.starts_with(&format!("{}-", p.name)))
            .ok_or_else(|| anyhow::anyhow!("no pod runs {owner}"))?;
        victim.kill9();
    }
    let killed = Instant::now();
    wait_for(
        &store,
        "repo-gone",
        s.dead_after * 4 + Duration::from_secs(30),
        |s| s.0 == "processing" && s.1 == 2,
    )
    .await?;
    report.gone_recovery_seconds = killed.elapsed().as_secs_f64();
    report.gone_trail = trail(&store, "repo-gone").await?;
    store.job_cancel("repo-gone").await?;
    let show = std::process::Command::new(&s.jobwarden)
        .args(["--config"])
        .arg(&config)
        .args(["jobs", "show", "repo-gone"])
        .output()?;
    report.jobs_show = String::from_utf8_lossy(&show.stdout).into_owned();
    report.all_completed = status(&store, "repo-long").await?.0 == "completed";
    for p in [&mut pod0, &mut pod1, &mut pod2] {
        p.stop();
    }
    Ok(report)
}
