//! The queue's consumers: re-provisioned when an operator deleted one (or the stream).

use super::*;

impl Producer {
    /// Makes sure lane `i`'s consumer still exists (at most every [`CONSUMER_CHECK_EVERY`]
    /// unless `now`), and provisions it again when an operator deleted it or the stream.
    pub(super) async fn check_consumer(&mut self, i: usize, now: bool) {
        let lane = &mut self.lanes[i];
        if !now && lane.last_check.elapsed() < CONSUMER_CHECK_EVERY {
            return;
        }
        lane.last_check = Instant::now();
        let info = tokio::time::timeout(BROKER_CALL_LIMIT, lane.consumer.info()).await;
        use async_nats::jetstream::context::ConsumerInfoErrorKind as Kind;
        let gone = matches!(
            &info,
            Ok(Err(e)) if matches!(e.kind(), Kind::NotFound | Kind::StreamNotFound)
        );
        if !gone {
            return;
        }
        let broker = &self.shared.broker;
        match broker.consumer_or_provision(&lane.lane).await {
            Ok(c) => lane.consumer = c,
            Err(e) => {
                warn!(lane = %lane.lane, cause = %e, "consumer is gone and cannot be created again");
                return;
            }
        }
        // The stream was likely deleted with all the queue's consumers: the other lanes are
        // provisioned now too, without a wait each.
        if !self.shared.config.nats.provision {
            return;
        }
        for (j, other) in self.lanes.iter_mut().enumerate() {
            if j == i || broker.consumer(&other.lane).await.is_ok() {
                continue;
            }
            match broker.provision_consumer(&other.lane).await {
                Ok(c) => other.consumer = c,
                Err(e) => {
                    warn!(lane = %other.lane, cause = %e, "consumer is gone and cannot be created again")
                }
            }
        }
    }
}
