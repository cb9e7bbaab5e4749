//! The claim statement: one insert for a group of new jobs, the full claim for the rest,
//! one by one only when PostgreSQL refuses one message's data; and its answer, by name.

use super::*;
use crate::store::Claim;
use futures::future::BoxFuture;

/// What a claim statement answered for its group.
pub(super) struct ClaimAnswer {
    /// One answer per input; `None` when nothing was claimed (the database is unavailable).
    pub(super) answers: Option<Answers>,
    /// How the database fared, for the outage log, when there is something to say.
    pub(super) health: Option<Result<(), String>>,
}

/// The answers of a claim that reached the database.
pub(super) struct Answers {
    /// False when this worker is not registered (declared dead): it claimed nothing.
    pub(super) registered: bool,
    /// True when the queue is paused: nothing was claimed of what is [`Answer::NotTried`].
    pub(super) paused: bool,
    /// One per input, at the same positions.
    pub(super) each: Vec<Answer>,
}

impl ClaimAnswer {
    /// Nothing claimed: the database failed with `e`.
    pub(super) fn failed(e: &crate::store::StoreError) -> ClaimAnswer {
        ClaimAnswer {
            answers: None,
            health: Some(Err(e.to_string())),
        }
    }

    /// The statement ran.
    pub(super) fn ran(registered: bool, each: Vec<Answer>) -> ClaimAnswer {
        ClaimAnswer {
            answers: Some(Answers {
                registered,
                paused: false,
                each,
            }),
            health: Some(Ok(())),
        }
    }
}

/// Claims a group. When one message's data makes PostgreSQL reject the whole statement
/// (a value it cannot store), claims them one by one so only that message is refused,
/// with PostgreSQL's reason; claims already committed then are kept whatever happens to
/// the rest.
pub(super) async fn claim(
    shared: &Shared,
    stale: (Duration, Option<Duration>),
    inputs: &[ClaimInput],
    known: &[bool],
) -> ClaimAnswer {
    let (me, store) = (&shared.worker_id, &shared.store);
    new_first(
        inputs,
        known,
        |at| {
            async move {
                let part = subset(inputs, &at);
                store.job_claim_new(me, stale.0, &part).await
            }
            .boxed()
        },
        |at| async move { claim_existing(shared, stale, &subset(inputs, &at)).await }.boxed(),
    )
    .await
}

/// The inputs at positions `at` (all of them, borrowed, when that is every one).
fn subset<'a>(inputs: &'a [ClaimInput], at: &[usize]) -> std::borrow::Cow<'a, [ClaimInput]> {
    if at.len() == inputs.len() {
        std::borrow::Cow::Borrowed(inputs)
    } else {
        std::borrow::Cow::Owned(at.iter().map(|&i| inputs[i].clone()).collect())
    }
}

/// The common case first: the messages are new jobs, and one plain insert (`new`) claims
/// them; `existing` then decides the rest (the inputs at the positions each is given).
/// Messages whose rows probably exist (`known`) go straight to `existing`: one of them would
/// make the insert fail as a whole (it then claims nothing, and `existing` takes them all).
async fn new_first<'a>(
    inputs: &'a [ClaimInput],
    known: &[bool],
    new: impl FnOnce(Vec<usize>) -> BoxFuture<'a, crate::store::Result<Vec<Option<Claim>>>>,
    existing: impl FnOnce(Vec<usize>) -> BoxFuture<'a, ClaimAnswer>,
) -> ClaimAnswer {
    let fresh_at: Vec<usize> = (0..inputs.len()).filter(|&i| !known[i]).collect();
    if fresh_at.is_empty() {
        return existing((0..inputs.len()).collect()).await;
    }
    let n_fresh = fresh_at.len();
    let fresh = match new(fresh_at.clone()).await {
        Ok(fresh) => fresh,
        Err(e) if e.rejected_data().is_none() => return ClaimAnswer::failed(&e),
        // One message's data was refused: the full claim finds which.
        Err(_) => return existing((0..inputs.len()).collect()).await,
    };
    let fresh = if n_fresh == inputs.len() {
        fresh
    } else {
        let mut all = vec![None; inputs.len()];
        for (i, f) in fresh_at.into_iter().zip(fresh) {
            all[i] = f;
        }
        all
    };
    if fresh.iter().all(Option::is_some) {
        let answers = fresh.into_iter().flatten().map(Answer::Claim).collect();
        return ClaimAnswer::ran(true, answers);
    }
    // The rest exist already (or this worker may not claim): the full statement decides.
    let rest: Vec<usize> = (0..inputs.len()).filter(|&i| fresh[i].is_none()).collect();
    let ClaimAnswer { answers, health } = existing(rest).await;
    let inserted = fresh.iter().any(Option::is_some);
    let (registered, paused, mut others) = match answers {
        Some(a) => (a.registered, a.paused, a.each.into_iter()),
        // The inserts are committed claims: they run; the rest goes back.
        None if inserted => (true, false, Vec::new().into_iter()),
        None => {
            return ClaimAnswer {
                answers: None,
                health,
            }
        }
    };
    let each = fresh
        .into_iter()
        .map(|f| match f {
            Some(c) => Answer::Claim(c),
            None => others.next().unwrap_or(Answer::NotTried),
        })
        .collect();
    ClaimAnswer {
        answers: Some(Answers {
            registered,
            paused,
            each,
        }),
        health,
    }
}

/// The full claim (`job_claim.sql`): new jobs and existing rows alike.
pub(super) async fn claim_existing(
    shared: &Shared,
    (stale, expire): (Duration, Option<Duration>),
    inputs: &[ClaimInput],
) -> ClaimAnswer {
    let me = &shared.worker_id;
    let store = &shared.store;
    one_statement(inputs, |part, _| store.job_claim(me, stale, expire, part)).await
}

/// A keyed queue's intake: the new jobs whose key has room start at once, up to `start` of
/// them (`job_intake_new.sql`; not in an ordered queue, whose keys wait for their earlier
/// messages); the rest are parked (`job_intake.sql`), to be taken by the queue's slots within
/// their keys' limits. `seqs`: the messages' stream sequences.
pub(super) async fn intake(
    shared: &Shared,
    rules: crate::config::KeyRules,
    (stale, expire): (Duration, Option<Duration>),
    (inputs, known, seqs): (&[ClaimInput], &[bool], &[i64]),
    start: usize,
) -> ClaimAnswer {
    let (me, store) = (&shared.worker_id, &shared.store);
    let park = |at: Vec<usize>| {
        async move {
            let part = subset(inputs, &at);
            let seqs: Vec<i64> = at.iter().map(|&i| seqs[i]).collect();
            one_statement(&part, |part, from| {
                store.job_intake(me, expire, rules, &seqs[from..from + part.len()], part)
            })
            .await
        }
        .boxed()
    };
    if rules.ordered || start == 0 {
        return park((0..inputs.len()).collect()).await;
    }
    new_first(
        inputs,
        known,
        |at| {
            async move {
                let part = subset(inputs, &at);
                let seqs: Vec<i64> = at.iter().map(|&i| seqs[i]).collect();
                store
                    .job_intake_new(me, stale, rules, (&seqs, start), &part)
                    .await
            }
            .boxed()
        },
        park,
    )
    .await
}

/// Runs `statement` (the full claim, or a keyed queue's intake) for a group; when one
/// message's data makes PostgreSQL reject the whole statement, runs it message by message
/// (`statement(part, position of part[0])`) so only that one is refused, with PostgreSQL's
/// reason; what committed meanwhile is kept whatever happens to the rest.
async fn one_statement<'a, F, Fut>(inputs: &'a [ClaimInput], statement: F) -> ClaimAnswer
where
    F: Fn(&'a [ClaimInput], usize) -> Fut,
    Fut: std::future::Future<Output = Result<crate::store::ClaimAnswer, crate::store::StoreError>>,
{
    match statement(inputs, 0).await {
        // Not registered: the statement wrote nothing, every message goes back.
        Ok(a) if !a.alive => {
            return ClaimAnswer::ran(false, inputs.iter().map(|_| Answer::NotTried).collect());
        }
        // A paused queue: nothing was claimed, every message goes back to the stream.
        Ok(a) if a.paused => {
            let mut answer =
                ClaimAnswer::ran(true, inputs.iter().map(|_| Answer::NotTried).collect());
            if let Some(a) = answer.answers.as_mut() {
                a.paused = true;
            }
            return answer;
        }
        Ok(a) => return ClaimAnswer::ran(true, a.claims.into_iter().map(Answer::Claim).collect()),
        Err(e) if e.rejected_data().is_none() => return ClaimAnswer::failed(&e),
        Err(_) => {}
    }
    let mut each = Vec::with_capacity(inputs.len());
    let mut health = None;
    // `alive`: still claiming; `registered`: the worker's row said it may.
    let (mut alive, mut registered) = (true, true);
    for (at, input) in inputs.iter().enumerate() {
        if !alive {
            each.push(Answer::NotTried);
            continue;
        }
        match statement(std::slice::from_ref(input), at).await {
            Ok(a) if !a.alive => {
                registered = false;
                alive = false;
                each.push(Answer::NotTried);
            }
            Ok(mut a) => each.push(Answer::Claim(a.claims.remove(0))),
            Err(e) => match e.rejected_data() {
                Some(reason) => each.push(Answer::Refused(format!(
                    "PostgreSQL cannot store this job: {reason}"
                ))),
                // Gone mid-way: what was claimed stays claimed, the rest goes back.
                None => {
                    health = Some(Err(e.to_string()));
                    alive = false;
                    each.push(Answer::NotTried);
                }
            },
        }
    }
    ClaimAnswer {
        answers: Some(Answers {
            registered,
            paused: false,
            each,
        }),
        health,
    }
}
