//! Members of batches published over NATS (schema version 34): before a group's rows are
//! written, the messages that name a batch are judged in one statement (`batch_join()`),
//! which declares each batch not known yet by its first member. A member the batch refuses
//! (the batch was enqueued whole through SQL, has finished, or was declared otherwise) is
//! kept as a dead job under its own id that says why — a dead member of its batch when the
//! batch is open, so that the batch does not wait for it for ever. So is a message the contract refuses whose
//! `batch` is readable. Groups without a batch member run no statement here.

use super::*;

impl Producer {
    /// Judges the batch members of a decoded group: refused ones move to `refused_members`
    /// (with the batch they are dead members of), salvaged ones (`rejected` whose body named a
    /// batch) learn theirs. When the statement fails, the group's batch members go back to
    /// the stream (they come back and are judged then); the rest claim as usual.
    pub(super) async fn judge_members(&mut self, group: &mut Decoded) {
        let salvaged = std::mem::take(&mut group.salvaged);
        if salvaged.is_empty() && group.inputs.iter().all(|i| i.job.batch.is_none()) {
            return;
        }
        let mut ids: Vec<&str> = group.inputs.iter().map(|i| i.job.id.as_str()).collect();
        let mut decls: Vec<Option<&crate::contract::BatchDecl>> =
            group.inputs.iter().map(|i| i.job.batch.as_ref()).collect();
        for (at, decl) in &salvaged {
            ids.push(group.rejected[*at].id.as_str());
            decls.push(Some(decl));
        }
        let verdicts = match self.shared.store.batch_join_decls(&ids, &decls).await {
            Ok(v) => v,
            Err(e) => {
                warn!(queue = %self.policy.name, cause = %e, "could not judge the batch members of a claim group; they go back to the stream");
                self.hand_back_members(group, &salvaged).await;
                return;
            }
        };
        let n = group.inputs.len();
        for ((at, _), v) in salvaged.iter().zip(&verdicts[n..]) {
            group.rejected[*at].batch = v.joins.clone();
        }
        if verdicts[..n].iter().all(|v| v.refused.is_none()) {
            for (input, v) in group.inputs.iter_mut().zip(&verdicts[..n]) {
                // A redelivery of a job whose batch takes no member now: its row exists.
                if v.joins.is_none() {
                    input.job.batch = None;
                }
            }
            return;
        }
        let inputs = std::mem::take(&mut group.inputs);
        let known = std::mem::take(&mut group.known);
        let messages = std::mem::take(&mut group.messages);
        for (((mut input, k), d), v) in inputs.into_iter().zip(known).zip(messages).zip(verdicts) {
            if v.joins.is_none() {
                input.job.batch = None;
            }
            match v.refused {
                // Its id is free (a member whose job exists is never refused): the dead job
                // keeps it, and its own fields, so a retry runs it.
                Some(reason) => group.refused_members.push((input, reason, Some(d))),
                None => {
                    group.inputs.push(input);
                    group.known.push(k);
                    group.messages.push(d);
                }
            }
        }
    }

    /// The batch members of a group go back to the stream (their batches could not be
    /// judged); the rest stay.
    async fn hand_back_members(
        &mut self,
        group: &mut Decoded,
        salvaged: &[(usize, crate::contract::BatchDecl)],
    ) {
        let mut back = Vec::new();
        let inputs = std::mem::take(&mut group.inputs);
        let known = std::mem::take(&mut group.known);
        let messages = std::mem::take(&mut group.messages);
        for ((input, k), d) in inputs.into_iter().zip(known).zip(messages) {
            if input.job.batch.is_some() {
                back.push(d);
            } else {
                group.inputs.push(input);
                group.known.push(k);
                group.messages.push(d);
            }
        }
        let mut at: Vec<usize> = salvaged.iter().map(|(i, _)| *i).collect();
        at.sort_unstable();
        for i in at.into_iter().rev() {
            back.push(group.rejected.remove(i).delivered);
        }
        self.hand_back(back).await;
    }
}
