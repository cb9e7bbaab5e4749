-- One fire of a schedule, as a job due at the fire's time under the fire's own id (a fire
-- enqueued twice is one job). $1 queue; $2 payload; $3 priority; $4 fire time (ms); $5 id;
-- $6 the schedule's expires_in (ms, NULL for none): the fire expires that long after its time;
-- $7 the schedule's key (NULL for none).
SELECT enqueue($1, $2, $3::int2::int4, run_at => to_timestamp($4::float8 / 1000), id => $5,
               expires_at => to_timestamp(($4::float8 + $6::int8) / 1000), key => $7::text)
