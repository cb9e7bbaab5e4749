-- Records a refused completion or failure in job_attempt_log (version 31). $1 id; $2 token;
-- $3 who asked; $4 why it was refused.
SELECT completion_refused($1::text, $2::text, $3::text, $4::text)
