-- Jobs whose dependents wait to be resolved (for resolving them one at a time after a round
-- failed). $1 most.
SELECT id FROM jobs WHERE chain_pending ORDER BY id LIMIT $1
