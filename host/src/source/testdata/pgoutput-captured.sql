-- Workload behind pgoutput-captured.hex (captured from PostgreSQL 15.18).
--
-- Run against a fresh cluster started with wal_level=logical, as a superuser:
--   psql -v ON_ERROR_STOP=1 -f pgoutput-captured.sql
-- then dump the slots as the header of pgoutput-captured.hex says.
--
-- Every statement below runs in its own transaction unless wrapped in
-- BEGIN/COMMIT; the comments name the pgoutput messages each one yields.

CREATE SCHEMA app;
CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');

-- DEFAULT replica identity (the primary key), an enum column (so a Type
-- message precedes the Relation message) and a text column kept out of line
-- so that an update that does not touch it sends it as 'u' (unchanged TOAST).
CREATE TABLE app.parent (
    id   int PRIMARY KEY,
    name text NOT NULL,
    big  text,
    m    app.mood
);
ALTER TABLE app.parent ALTER COLUMN big SET STORAGE EXTERNAL;

-- A serial key (for RESTART IDENTITY), a foreign key (for CASCADE) and a
-- generated column, which pgoutput on PostgreSQL 15 does not send.
CREATE TABLE public.child (
    id        serial PRIMARY KEY,
    parent_id int REFERENCES app.parent (id),
    v         numeric,
    doubled   numeric GENERATED ALWAYS AS (v * 2) STORED
);

-- REPLICA IDENTITY FULL: updates and deletes carry the whole old row ('O').
CREATE TABLE public.full_t (id int, note text);
ALTER TABLE public.full_t REPLICA IDENTITY FULL;

-- REPLICA IDENTITY USING INDEX: the index's columns are the key.
CREATE TABLE public.idx_t (a int NOT NULL, b text, c int NOT NULL);
CREATE UNIQUE INDEX idx_t_c ON public.idx_t (c);
ALTER TABLE public.idx_t REPLICA IDENTITY USING INDEX idx_t_c;

-- REPLICA IDENTITY NOTHING: only inserts can be published.
CREATE TABLE public.nothing_t (a int);
ALTER TABLE public.nothing_t REPLICA IDENTITY NOTHING;

CREATE PUBLICATION pub FOR TABLE app.parent, public.child, public.full_t,
    public.idx_t, public.nothing_t;
SELECT 'slot' FROM pg_create_logical_replication_slot('slot', 'pgoutput');

-- tx 1: B, Y(app.mood), R(app.parent), I x2, R(public.child), I, C
BEGIN;
INSERT INTO app.parent VALUES (1, 'one', repeat('x', 3000), 'happy');
INSERT INTO app.parent VALUES (2, 'two', NULL, NULL);
INSERT INTO public.child (parent_id, v) VALUES (1, 1.5);
COMMIT;

-- tx 2: B, U (no old tuple; big sent as 'u'), C
UPDATE app.parent SET name = 'uno' WHERE id = 1;

-- tx 3: B, U ('K' old key, then new tuple), C
UPDATE app.parent SET id = 20 WHERE id = 2;

-- tx 4: B, R(public.full_t), I, U ('O' old row), D ('O'), C
BEGIN;
INSERT INTO public.full_t VALUES (1, 'first');
UPDATE public.full_t SET note = 'second' WHERE id = 1;
DELETE FROM public.full_t WHERE id = 1;
COMMIT;

-- tx 5: B, D ('K': key only, other columns null), C
DELETE FROM app.parent WHERE id = 20;

-- tx 6: B, M (transactional), C
SELECT 'msg' FROM pg_logical_emit_message(true, 'datum.test', 'in a transaction');

-- No transaction: M (non-transactional), alone
SELECT 'msg' FROM pg_logical_emit_message(false, 'datum.test', 'outside');

-- tx 7: B, T (2 relations, CASCADE | RESTART IDENTITY), C
-- (app.parent still holds id 1, which public.child references)
TRUNCATE app.parent, public.child RESTART IDENTITY CASCADE;

-- tx 8: a transaction replayed from a replication origin: B, O, R, I, C
SELECT 'origin' FROM pg_replication_origin_create('upstream');
SELECT 'origin' FROM pg_replication_origin_session_setup('upstream');
BEGIN;
SELECT 'origin' FROM pg_replication_origin_xact_setup('0/ABCDEF', now());
INSERT INTO public.full_t VALUES (2, 'from upstream');
COMMIT;
SELECT 'origin' FROM pg_replication_origin_session_reset();

-- tx 9: DDL, then a change: the Relation message is sent again with the new
-- column. B, R(public.full_t, 3 columns), I, C
ALTER TABLE public.full_t ADD COLUMN extra int;
INSERT INTO public.full_t VALUES (3, 'after ddl', 42);

-- tx 10: B, R(public.idx_t), I, U ('K' with only column c), R(public.nothing_t),
-- I, C
BEGIN;
INSERT INTO public.idx_t VALUES (1, 'b', 10);
UPDATE public.idx_t SET c = 11, b = 'bb' WHERE c = 10;
INSERT INTO public.nothing_t VALUES (5);
COMMIT;

-- The second slot sees only what follows: it is read with binary = true, so
-- columns of types with a send function come as 'b'.
SELECT 'slot' FROM pg_create_logical_replication_slot('slot_bin', 'pgoutput');

-- tx 11 (both slots): B, Y, R(app.parent), I, R(public.child), I, C
BEGIN;
INSERT INTO app.parent VALUES (7, 'seven', NULL, 'ok');
INSERT INTO public.child (parent_id, v) VALUES (7, -0.25);
COMMIT;
