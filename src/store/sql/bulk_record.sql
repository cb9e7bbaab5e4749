-- Records a bulk action as it starts. $1 by; $2 action; $3 filter; $4 jobs matched.
INSERT INTO bulk_actions (by, action, filter, matched) VALUES ($1, $2, $3, $4) RETURNING id
