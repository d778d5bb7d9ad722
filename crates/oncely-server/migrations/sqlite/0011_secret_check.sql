-- Keyed hashes (HMAC-SHA256 of a fixed text, hex) of the server secret the processes of this database
-- use, and of the previous one during a rotation: a process started with another secret is
-- refused, rather than answering 422 to its neighbours' retries or, where keys are scoped by a
-- credential hashed with the secret (`oncely gateway`), running them again. `retired_macs`: the
-- secrets of rotations that ended (comma-separated), never accepted again. Never the secret.
CREATE TABLE oncely_secret_check (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    current_mac TEXT NOT NULL,
    previous_mac TEXT,
    retired_macs TEXT NOT NULL DEFAULT ''
);
