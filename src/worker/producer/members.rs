//! Members of batches published over NATS (schema version 34): before a group's rows are
//! written, the messages that name a batch are judged in one statement (`batch_join.sql`),
//! which declares each batch not known yet by its first member — in the claim's own future,
//! so a group's judging waits for nothing but its own statement, and other groups' claims
//! go on meanwhile. A member the batch refuses (the batch was enqueued whole through SQL,
//! has finished, or was declared otherwise) is kept as a dead job under its own id that says
//! why — a dead member of its batch when the batch is open, so that the batch does not wait
//! for it for ever. So is a message the contract refuses whose `batch` is readable. Groups
//! without a batch member run no statement here.

use super::*;
use crate::contract::BatchDecl;
use crate::store::BatchVerdict;
use std::sync::Mutex;

/// How long a batch the statement found open, declared as its member declared it, lets the
/// next members that declare it so join without asking again: a member's claim then costs
/// no statement more than a plain job's (the statement is a round trip: +1 ms publish→start).
/// Within it, a new member of a batch that has just finished joins it rather than being
/// refused (as one past the batch's size may, see docs/message-format.md).
const OPEN_FOR: Duration = Duration::from_secs(1);
/// Most batches remembered as open at once (older entries go first).
const OPEN_MAX: usize = 10_000;

/// The batches found open lately, each as it was declared and when (see [`OPEN_FOR`]).
#[derive(Default)]
pub(crate) struct OpenBatches(Mutex<HashMap<String, (BatchDecl, Instant)>>);

impl OpenBatches {
    /// The batch was found open lately, declared as `decl` declares it (a message's
    /// declaration is read in one form: declarations that mean the same are equal).
    fn open(&self, decl: &BatchDecl) -> bool {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&decl.id)
            .is_some_and(|(d, at)| at.elapsed() < OPEN_FOR && d == decl)
    }

    fn found_open(&self, decl: &BatchDecl) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= OPEN_MAX {
            map.retain(|_, (_, at)| at.elapsed() < OPEN_FOR);
        }
        if map.len() < OPEN_MAX {
            map.insert(decl.id.clone(), (decl.clone(), Instant::now()));
        }
    }
}

/// Judges the members of `inputs` and the batches of the `salvaged` rejected messages (by
/// their position in `rejected`); `None` when none names a batch. A member of a batch found
/// open lately, declared alike, joins it without the statement (see [`OPEN_FOR`]).
async fn verdicts(
    shared: &Shared,
    inputs: &[ClaimInput],
    rejected: &[Rejected],
    salvaged: &[(usize, BatchDecl)],
) -> crate::store::Result<Option<Vec<BatchVerdict>>> {
    if salvaged.is_empty() && inputs.iter().all(|i| i.job.batch.is_none()) {
        return Ok(None);
    }
    let mut all: Vec<(&str, &BatchDecl)> = Vec::new();
    let mut at: Vec<Option<usize>> = Vec::new();
    for (id, decl) in inputs
        .iter()
        .map(|i| (i.job.id.as_str(), i.job.batch.as_ref()))
        .chain(
            salvaged
                .iter()
                .map(|(i, d)| (rejected[*i].id.as_str(), Some(d))),
        )
    {
        at.push(decl.map(|d| {
            all.push((id, d));
            all.len() - 1
        }));
    }
    let known = &shared.open_batches;
    let ask: Vec<usize> = (0..all.len()).filter(|&k| !known.open(all[k].1)).collect();
    let mut judged = vec![None; all.len()];
    if !ask.is_empty() {
        let ids: Vec<&str> = ask.iter().map(|&k| all[k].0).collect();
        let decls: Vec<Option<&BatchDecl>> = ask.iter().map(|&k| Some(all[k].1)).collect();
        let answers = shared.store.batch_join_decls(&ids, &decls).await?;
        for (&k, v) in ask.iter().zip(answers) {
            if v.open {
                known.found_open(all[k].1);
            }
            judged[k] = Some(v);
        }
    }
    Ok(Some(
        at.into_iter()
            .map(|k| match k {
                None => BatchVerdict::default(),
                Some(k) => judged[k].take().unwrap_or_else(|| BatchVerdict {
                    joins: Some(all[k].1.id.clone()),
                    refused: None,
                    open: true,
                }),
            })
            .collect(),
    ))
}

/// Judges the batches of rejected messages alone (a group with nothing to claim): each one
/// whose batch is open becomes a dead member of it. When the statement fails they are kept
/// dead without one.
pub(super) async fn judge_salvaged(
    shared: &Shared,
    rejected: &mut [Rejected],
    salvaged: &[(usize, BatchDecl)],
) {
    match verdicts(shared, &[], rejected, salvaged).await {
        Ok(Some(v)) => {
            for ((at, _), v) in salvaged.iter().zip(v) {
                rejected[*at].batch = v.joins;
            }
        }
        Ok(None) => {}
        Err(e) => warn!(cause = %e, "could not judge the batches of refused messages"),
    }
}

/// Judges a claim group's batch members: refused ones move to `refused_members` (with the
/// batch they are dead members of, if any), salvaged rejected ones learn theirs, and a
/// member whose batch takes no member now (a redelivery: its row exists) claims without
/// one. On an error nothing changed: the caller hands the whole group back.
pub(super) async fn judge_group(shared: &Shared, group: &mut Claiming) -> crate::store::Result<()> {
    let salvaged = std::mem::take(&mut group.salvaged);
    let Some(verdicts) = verdicts(shared, &group.inputs, &group.rejected, &salvaged).await? else {
        return Ok(());
    };
    let n = group.inputs.len();
    for ((at, _), v) in salvaged.iter().zip(&verdicts[n..]) {
        group.rejected[*at].batch = v.joins.clone();
    }
    if verdicts[..n].iter().all(|v| v.refused.is_none()) {
        for (input, v) in group.inputs.iter_mut().zip(&verdicts[..n]) {
            if v.joins.is_none() {
                input.job.batch = None;
            }
        }
        return Ok(());
    }
    let inputs = std::mem::take(&mut group.inputs);
    let known = std::mem::take(&mut group.known);
    let messages = std::mem::take(&mut group.messages);
    for (((mut input, k), d), v) in inputs.into_iter().zip(known).zip(messages).zip(verdicts) {
        if v.joins.is_none() {
            input.job.batch = None;
        }
        match v.refused {
            // Its id is free (a member whose job exists is never refused): the dead job keeps
            // it, and its own fields, so a retry runs it.
            Some(reason) => group.refused_members.push((input, reason, Some(d))),
            None => {
                group.inputs.push(input);
                group.known.push(k);
                group.messages.push(d);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_found_open_lets_members_declared_alike_join_for_a_moment() {
        let decl = |size: i32| BatchDecl {
            id: "b".into(),
            size,
            ..BatchDecl::default()
        };
        let known = OpenBatches::default();
        let (two, three) = (decl(2), decl(3));
        assert!(!known.open(&two));
        known.found_open(&two);
        assert!(known.open(&two));
        // Declared otherwise: asked again (and refused).
        assert!(!known.open(&three));
        // Past OPEN_FOR, asked again.
        known.0.lock().unwrap().get_mut("b").unwrap().1 -= OPEN_FOR;
        assert!(!known.open(&two));
    }
}
