-- Records how many jobs a bulk action changed, when it ends. $1 id; $2 changed.
UPDATE bulk_actions SET changed = $2, finished_at = now() WHERE id = $1
