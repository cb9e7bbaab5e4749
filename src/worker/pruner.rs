//! The Pruner: retention (invariant 15, "history does not slow the present"). Every
//! `retention.every` one worker — whichever takes the schema's advisory lock
//! ([`Store::prune_session`]) — deletes finished rows whose keep is over: jobs by status
//! (`completed`, `cancelled`, `dead`; their attempt-log and job_deps rows with them), poison
//! messages, rows of stopped workers, spent flow grants and orphan attempt rows. The other
//! workers find the lock taken and skip the round; the lock is a session lock on a connection
//! of the round's own, so a pod that dies mid-round holds it no longer.
//!
//! Deletes go in batches of `retention.batch` rows, oldest first, `FOR UPDATE SKIP LOCKED`,
//! with `retention.pause` between them, so a large backlog never holds locks the hot path
//! waits for or a long transaction. A job is never deleted while it is not finished, while its
//! chain is unresolved (`chain_pending`) or while a job that depends on it has not finished.
//! `jobwarden prune` runs the same round ([`Pruner::run_once`]).

use super::outage::Outage;
use super::Shared;
use crate::config::{Policy, FINISHED};
use crate::store::{PrunePreview, PruneSession, QueueCut, Result, Store};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Before every completed_at: where each status's walk starts.
const FROM_THE_START: &str = "-infinity";
/// Most orphan attempt rows deleted per round (they need a scan of the log to find).
const ORPHANS_PER_ROUND: i64 = 10_000;

/// What one round deleted.
#[derive(Debug, Default, Clone)]
pub struct PruneReport {
    /// Another worker held the lock: this round deleted nothing.
    pub skipped: bool,
    /// The round stopped early (shutdown).
    pub cancelled: bool,
    /// Jobs deleted, by (queue, status).
    pub jobs: BTreeMap<(String, String), u64>,
    pub poison: u64,
    pub workers: u64,
    pub flow_grants: u64,
    pub orphan_attempts: u64,
    pub took: Duration,
}

impl PruneReport {
    pub fn jobs_total(&self) -> u64 {
        self.jobs.values().sum()
    }
}

/// One round of retention under a policy (see the module's header).
pub struct Pruner {
    store: Store,
    policy: Policy,
}

impl Pruner {
    pub fn new(store: Store, policy: Policy) -> Pruner {
        Pruner { store, policy }
    }

    /// Per status, the queues kept other than by the default (an override or a keep_count).
    async fn cuts(&self, s: &PruneSession) -> Result<Vec<(&'static str, QueueCut)>> {
        let p = &self.policy;
        let mut floors: HashMap<&str, String> = HashMap::new();
        for (queue, n) in &p.counts {
            if let Some(f) = s.prune_count_floor(queue, *n).await? {
                floors.insert(queue, f);
            }
        }
        let mut queues: Vec<&str> = p.overrides.iter().map(|o| o.queue.as_str()).collect();
        queues.extend(floors.keys().copied());
        queues.sort_unstable();
        queues.dedup();
        let mut cuts = Vec::new();
        for q in queues {
            for status in FINISHED {
                let keep = p
                    .overrides
                    .iter()
                    .find(|o| o.queue == q && o.status == status)
                    .map_or(p.default_keep(status), |o| o.keep);
                cuts.push((
                    status,
                    QueueCut {
                        queue: q.to_string(),
                        keep,
                        floor: floors.get(q).cloned(),
                    },
                ));
            }
        }
        Ok(cuts)
    }

    /// What a round would delete now, per queue and status (nothing is deleted; no lock
    /// taken, so a round running meanwhile may have deleted part of it already).
    pub async fn preview(&self) -> Result<Vec<PrunePreview>> {
        let s = self.store.prune_reader().await?;
        let cuts = self.cuts(&s).await?;
        let got = s.prune_preview(&self.policy.defaults, &cuts).await?;
        s.finish().await?;
        Ok(got)
    }

    /// Waits the pause between two batches; false when cancelled.
    async fn pause(&self, cancel: &CancellationToken) -> bool {
        tokio::select! {
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(self.policy.pause) => true,
        }
    }

    /// One round: every status, then the other tables, batch by batch. `on_batch` hears
    /// each batch of jobs deleted (queue, status, count). Stops between batches when
    /// `cancel` fires.
    pub async fn run_once(
        &self,
        cancel: &CancellationToken,
        on_batch: &mut (dyn FnMut(&str, &str, u64) + Send),
    ) -> Result<PruneReport> {
        let started = Instant::now();
        let mut report = PruneReport::default();
        let Some(s) = self.store.prune_session().await? else {
            report.skipped = true;
            return Ok(report);
        };
        let cuts = self.cuts(&s).await?;
        let batch = self.policy.batch;
        'statuses: for status in FINISHED {
            let mine: Vec<QueueCut> = cuts
                .iter()
                .filter(|(st, _)| *st == status)
                .map(|(_, c)| c.clone())
                .collect();
            let mut after = FROM_THE_START.to_string();
            loop {
                let gone = s
                    .prune_jobs(
                        status,
                        self.policy.default_keep(status),
                        &mine,
                        &after,
                        batch,
                    )
                    .await?;
                let mut by_queue: BTreeMap<&str, u64> = BTreeMap::new();
                for (queue, at) in &gone {
                    *by_queue.entry(queue).or_default() += 1;
                    // Printed in UTC with the same form: text order is time order.
                    if *at > after {
                        after.clone_from(at);
                    }
                }
                for (queue, n) in by_queue {
                    on_batch(queue, status, n);
                    *report
                        .jobs
                        .entry((queue.to_string(), status.to_string()))
                        .or_default() += n;
                }
                if (gone.len() as i64) < batch {
                    break;
                }
                if !self.pause(cancel).await {
                    report.cancelled = true;
                    break 'statuses;
                }
            }
        }
        if !report.cancelled {
            self.prune_rest(&s, cancel, &mut report).await?;
        }
        s.finish().await?;
        report.took = started.elapsed();
        Ok(report)
    }

    /// Poison messages, stopped workers, spent grants (each batch by batch), then one batch
    /// of orphan attempt rows.
    async fn prune_rest(
        &self,
        s: &PruneSession,
        cancel: &CancellationToken,
        report: &mut PruneReport,
    ) -> Result<()> {
        let limit = u64::try_from(self.policy.batch).unwrap_or(0);
        for table in [Rest::Poison, Rest::Workers, Rest::FlowGrants] {
            loop {
                let n = self.rest_batch(s, table).await?;
                *match table {
                    Rest::Poison => &mut report.poison,
                    Rest::Workers => &mut report.workers,
                    Rest::FlowGrants => &mut report.flow_grants,
                } += n;
                if n < limit {
                    break;
                }
                if !self.pause(cancel).await {
                    report.cancelled = true;
                    return Ok(());
                }
            }
        }
        report.orphan_attempts = s
            .prune_attempt_orphans(self.policy.keep_dead, ORPHANS_PER_ROUND)
            .await?;
        Ok(())
    }

    /// One batch of one of the other tables.
    async fn rest_batch(&self, s: &PruneSession, table: Rest) -> Result<u64> {
        let (p, batch) = (&self.policy, self.policy.batch);
        match table {
            Rest::Poison => s.prune_poison(p.keep_dead, batch).await,
            Rest::Workers => s.prune_workers(p.keep_workers, batch).await,
            Rest::FlowGrants => s.prune_flow_grants(batch).await,
        }
    }
}

/// The tables a round prunes after the jobs.
#[derive(Clone, Copy)]
enum Rest {
    Poison,
    Workers,
    FlowGrants,
}

/// The supervised service: a round every `retention.every` (the first one `every` after
/// start), by whichever worker takes the lock.
pub(crate) struct PrunerService {
    shared: Arc<Shared>,
}

impl PrunerService {
    pub fn new(shared: Arc<Shared>) -> PrunerService {
        PrunerService { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let Some(policy) = self.shared.config.retention_policy() else {
            info!("retention is off (retention.enabled = false): finished jobs are kept");
            // Nothing to do, but a service runs until shutdown: an early end is a failure.
            cancel.cancelled().await;
            return;
        };
        let every = policy.every;
        let pruner = Pruner::new(self.shared.store.clone(), policy);
        let mut outage = Outage::new("retention round");
        let mut wait = every;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let metrics = &self.shared.metrics;
            let mut count = |queue: &str, status: &str, n: u64| metrics.pruned(queue, status, n);
            wait = match pruner.run_once(&cancel, &mut count).await {
                Ok(r) => {
                    outage.ok();
                    self.record(&r);
                    every
                }
                Err(e) => outage.failed(&e),
            };
        }
    }

    fn record(&self, r: &PruneReport) {
        if r.skipped {
            return;
        }
        self.shared.metrics.prune_round(r.took);
        let (jobs, rest) = (
            r.jobs_total(),
            r.poison + r.workers + r.flow_grants + r.orphan_attempts,
        );
        if jobs + rest == 0 {
            return;
        }
        let by: Vec<String> = r
            .jobs
            .iter()
            .map(|((q, s), n)| format!("{q}/{s}: {n}"))
            .collect();
        let line = format!(
            "retention round: {jobs} jobs ({}), {} poison messages, {} stopped workers, {} flow \
             grants, {} orphan attempt rows deleted in {:.1}s",
            by.join(", "),
            r.poison,
            r.workers,
            r.flow_grants,
            r.orphan_attempts,
            r.took.as_secs_f64()
        );
        if r.cancelled {
            warn!("{line} (stopped early: shutting down)");
        } else {
            info!("{line}");
        }
    }
}
