-- After the scheduler's publishes: jobs the stream took become `queued` with their new
-- generation and the sequence the stream gave them; jobs it answered `duplicate` (their
-- message id was taken) stay due with the next generation, so the next round publishes
-- them under a fresh id; jobs whose publish failed for now wait $5 ms, so they never hold
-- back the jobs behind them (counted from the end of the round: `now()` is its start).
-- $1 published ids; $2 their stream sequences; $3 duplicate ids; $4 failed ids;
-- $5 retry delay (ms).
WITH published AS (
    UPDATE jobs j
    SET status = 'queued', generation = j.generation + 1, stream_seq = p.seq, updated_at = now()
    FROM unnest($1::text[], $2::int8[]) AS p(id, seq)
    WHERE j.id = ANY($1::text[]) AND j.id = p.id AND j.status = 'scheduled'
    RETURNING j.id
),
duplicate AS (
    UPDATE jobs SET generation = generation + 1, updated_at = now()
    WHERE id = ANY($3::text[]) AND status = 'scheduled'
    RETURNING id
),
failed AS (
    UPDATE jobs SET scheduled_at = clock_timestamp() + $5::int8 * interval '1 millisecond',
                    updated_at = now()
    WHERE id = ANY($4::text[]) AND status = 'scheduled'
    RETURNING id
)
SELECT (SELECT count(*) FROM published), (SELECT count(*) FROM duplicate),
       (SELECT count(*) FROM failed)
