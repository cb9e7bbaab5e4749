-- Wakes the scheduler on every enqueue (the NOTIFY of `enqueue()` names the schema).
LISTEN jobwarden_enqueue
