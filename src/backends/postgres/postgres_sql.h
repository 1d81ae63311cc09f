// File: backends/postgres/postgres_sql.h (internal)
//
// Every SQL statement of the postgres:// store, each explained once. "{schema}" is replaced by
// the (validated, quoted) schema name when a backend opens; "{channel}" by the NOTIFY channel
// (the schema name as a string literal). Parameters are text ($1...) sent with
// PQsendQueryParams: the unnamed statement, never a named prepared one, so that PgBouncer in
// transaction pooling can carry every statement of table mode.
//
// One table serves both modes. A key's row is created by its first grant and never deleted:
// `fence` therefore only ever grows, whatever happens to grants (release, expiry, force-release,
// a killed holder), and a release clears the grant's columns instead of deleting the row.
// A second table, `records`, keeps each key's record (Backend::Finish): its own row with its own
// expiry, which no grant's end touches.
//
// A grant kept after its holder (Backend::Finish with keep > 0) is, in both modes, the key's row
// with holder and fence left as they were, the token with ':kept' after it (no owner sends
// that: backend.h's kKeptTokenSuffix; the listings show it after the token's first 8
// characters, for TakeKeptMark), expires_at = the end of the keep on the server's clock, and
// pid = lock_id = NULL. Table mode needs nothing more: that is an ordinary
// live row. Advisory mode cannot keep the lock itself (a session lock dies with its session,
// and the holder's session may end at once), so its finish statement writes that row and then
// unlocks, and every advisory grant statement refuses while such a row is live (LH_PG_KEPT):
// the check sits in ON CONFLICT DO UPDATE's WHERE, which PostgreSQL evaluates on the newest
// version of the row after waiting for any transaction that is writing it. That wait also
// orders a finish's unlock (effective at once, before its commit) before the next grant: the
// next holder's statement waits for the finish to commit, so it never misses the kept row nor,
// when it reads the record next, the record written with it.
//
// Advisory mode's lock id is FNV-1a 64 over "<schema>\0<key>" (see AdvisoryLockId), computed the
// same way by every client; pg_locks shows a bigint advisory lock as classid (high 32 bits),
// objid (low 32 bits) and objsubid = 1, which kLockIdOf reassembles.
//
// Thread safety: constants.

#pragma once

#include <string_view>

namespace leasehold::internal::postgres_sql {

// The table, also printed by `leasehold schema`. key: the lease's name; fence: the last fencing
// token handed out for it; token/holder/ttl_ms: the live grant (NULL when free); expires_at: the
// grant's end on the server's clock (table mode), or its last renewal plus ttl (advisory mode,
// for status and list only: the session, not this column, keeps an advisory grant); lock_id/pid:
// advisory mode's lock and the server process of the session that holds it. While shared or
// semaphore grants of the key may be live (table mode), token is the marker LH_PG_SHARED_MARKER
// and the grants are rows of `shares` (kCreateSharesTable).
inline constexpr std::string_view kCreateSchema = R"sql(CREATE SCHEMA IF NOT EXISTS {schema};)sql";

inline constexpr std::string_view kCreateTable = R"sql(CREATE TABLE IF NOT EXISTS {schema}.leases (
  key        text PRIMARY KEY,
  fence      bigint NOT NULL,
  token      text,
  holder     text,
  ttl_ms     bigint,
  expires_at timestamptz,
  lock_id    bigint,
  pid        integer
);)sql";

// The records table, also printed by `leasehold schema`. key: the lease's name; value: its
// record, opaque bytes (bytea, so any byte and any database encoding will do); expires_at: the
// record's end on the server's clock. A row is replaced by the key's next record; an expired
// one reads as none.
inline constexpr std::string_view kCreateRecordsTable =
    R"sql(CREATE TABLE IF NOT EXISTS {schema}.records (
  key        text PRIMARY KEY,
  value      bytea NOT NULL,
  expires_at timestamptz NOT NULL
);)sql";

// The shares table (shared leases, table mode), also printed by `leasehold schema`. One row per
// live shared or semaphore grant of a key, by slot (0..limit-1): token, holder, ttl_ms,
// expires_at as in `leases`, fence the grant's fencing token (taken from the key's row in
// `leases`, the key's one counter), lim the limit its holder asked for (1: a shared grant of a
// read/write key; N > 1: a semaphore of N). Slot -1 is the key's writer intent: token = the
// waiting writer's waiter id, holder its identity, expires_at its end; fence and lim 0. A key
// with live rows here has a marker in its `leases` row (kSharedMarker) that keeps every
// exclusive statement, this release's fast one and older releases' alike, from granting it.
// Rows are deleted when their grant ends (release, expiry noticed by the next acquire), so the
// role needs DELETE here too.
inline constexpr std::string_view kCreateSharesTable =
    R"sql(CREATE TABLE IF NOT EXISTS {schema}.shares (
  key        text NOT NULL,
  slot       integer NOT NULL,
  token      text NOT NULL,
  holder     text,
  ttl_ms     bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  fence      bigint NOT NULL,
  lim        integer NOT NULL,
  PRIMARY KEY (key, slot)
);)sql";

// The token of a key's `leases` row while shared or semaphore grants of it may be live: no
// owner token (32 hex digits) equals it, so no renew, release or fenced write of an exclusive
// grant matches it, and its expiry (LH_PG_SHARED_MARKER_UNTIL: NULL, neither past nor future)
// makes every exclusive acquire statement (kTableAcquire, also that of releases before shared
// leases: `token IS NULL OR expires_at <= now` is not true) refuse the key, while every
// statement that looks for a live grant (`expires_at > now`: inspect, list, force-release, old
// and new) passes it by: an older release's force-release cannot clear it. Only the
// transaction of kTableAcquireShared, which reads `shares` under the key row's lock, grants an
// exclusive lease over it (or replaces it). The marker outlives the shares (a release leaves it):
// the next acquire through kTableAcquireShared clears or replaces it.
#define LH_PG_SHARED_MARKER "'(shared)'"
#define LH_PG_SHARED_MARKER_UNTIL "NULL::timestamptz"
#define LH_PG_SHARED_HOLDER "'shared or semaphore holders (leasehold status lists them)'"

// Whether the shares table exists and this role may use it (SELECT, INSERT, UPDATE, DELETE).
// $1 the table's name. has_table_privilege is NULL-safe through the CASE.
inline constexpr std::string_view kSharesState = R"sql(
SELECT to_regclass($1) IS NOT NULL,
       CASE WHEN to_regclass($1) IS NULL THEN false
            ELSE has_table_privilege(to_regclass($1), 'SELECT, INSERT, UPDATE, DELETE')
                 AND has_table_privilege(to_regclass($1), 'SELECT')
                 AND has_table_privilege(to_regclass($1), 'INSERT')
                 AND has_table_privilege(to_regclass($1), 'UPDATE')
                 AND has_table_privilege(to_regclass($1), 'DELETE') END)sql";

// Whether the schema and the two tables exist: to_regnamespace/to_regclass return NULL, not an
// error, for a missing name. $1 schema, $2 leases table, $3 records table.
inline constexpr std::string_view kSchemaState = R"sql(
SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL,
       to_regclass($3) IS NOT NULL)sql";

// The server's wall clock in microseconds since the Unix epoch (clock_timestamp(): the time of
// the call, not of the transaction's start).
inline constexpr std::string_view kWallClock = R"sql(
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)sql";

// The key's record, hex-encoded (bytea's text output depends on bytea_output), if it has not
// expired on the server's clock. $1 key. Both modes.
inline constexpr std::string_view kReadRecord = R"sql(
SELECT encode(value, 'hex') FROM {schema}.records
WHERE key = $1 AND expires_at > clock_timestamp())sql";

// The live records whose key starts with $1, values hex-encoded as in kReadRecord, ordered
// bytewise. starts_with takes the prefix literally, as kTableList does ('%' and '_' need no
// escaping), and expiry is judged on the server's clock. Both modes.
inline constexpr std::string_view kListRecords = R"sql(
SELECT key, encode(value, 'hex') FROM {schema}.records
WHERE starts_with(key, $1) AND expires_at > clock_timestamp()
ORDER BY key COLLATE "C")sql";

// Whether the row `l` is a grant kept after its holder (see the top of this file).
#define LH_PG_KEPT(l) \
  "(" l ".pid IS NULL AND " l ".token IS NOT NULL AND " l ".expires_at > clock_timestamp())"

// The advisory lock id of a pg_locks row (bigint form: objsubid = 1).
#define LH_PG_LOCK_ID_OF(k) "((" k ".classid::bigint << 32) | " k ".objid::bigint)"

// The epoch part of a fencing token: (timeline - 1) << 40, the server's current PostgreSQL
// timeline read in the statement that bumps the counter (pg_current_wal_lsn() is the primary's
// insert position; its WAL file name starts with the timeline in 8 hex digits; on a standby it
// fails, as the write would). A key's counter moves to greatest(counter, epoch) + 1, so a token
// handed out on a later timeline is greater than every token of every earlier one, even when
// the last bumps before a failover or a restore were lost; on a server that never failed over
// (timeline 1) the epoch is 0 and tokens count 1, 2, 3... as before. Layout: bits 40-62 the
// timeline less one, bits 0-39 the count within the timeline (2^40 grants of one key per
// timeline before the count would reach the next epoch). A timeline above 2^23 overflows the
// bigint: the grant fails ("bigint out of range") rather than handing out a smaller token.
#define LH_PG_EPOCH                                                                       \
  "((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) " \
  "<< 40)"

// The server's timeline: a primary's from its WAL insert position (as LH_PG_EPOCH), a
// standby's from its last checkpoint (pg_current_wal_lsn() fails during recovery).
#define LH_PG_TIMELINE                                              \
  "CASE WHEN pg_is_in_recovery() "                                  \
  "THEN (SELECT timeline_id FROM pg_control_checkpoint())::bigint " \
  "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END"

// The server a new connection reached: pg_backend_pid() of the session that runs it (compared
// with the pid libpq got at startup, PQbackendPID, which a pooler such as PgBouncer makes up,
// to detect a pooler in between), the cluster's system identifier, its timeline
// (LH_PG_TIMELINE) and whether it is a standby (PgServerIdentity, postgres_history.h). Every
// role may read pg_control_system() and pg_control_checkpoint().
inline constexpr std::string_view kServerIdentity =
    "SELECT pg_backend_pid(), (SELECT system_identifier FROM "
    "pg_control_system())::text, " LH_PG_TIMELINE ", pg_is_in_recovery()";

// ---- table mode ----

// Try-acquire, table mode. $1 key, $2 owner token, $3 holder, $4 ttl in ms.
// - `granted` inserts the key's first row (fence: the epoch + 1, LH_PG_EPOCH), or takes over
//   the existing row only if it is free (token NULL) or expired on the server's clock, bumping
//   fence (past the epoch) in the same statement;
//   ON CONFLICT locks the row, so two acquirers never both succeed.
// - If nothing was granted, the second branch returns the current holder (from the statement's
//   snapshot; a holder that committed after it shows as no row: held, holder unknown).
// - remaining is rounded up so that a live grant never shows 0 ms.
inline constexpr std::string_view kTableAcquire = R"sql(
WITH granted AS (
  INSERT INTO {schema}.leases AS l (key, fence, token, holder, ttl_ms, expires_at)
  VALUES ($1, )sql" LH_PG_EPOCH R"sql( + 1, $2, $3, $4::bigint,
          clock_timestamp() + $4::bigint * interval '1 millisecond')
  ON CONFLICT (key) DO UPDATE
    SET fence = greatest(l.fence, )sql" LH_PG_EPOCH R"sql() + 1, token = EXCLUDED.token,
        holder = EXCLUDED.holder, ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at,
        lock_id = NULL, pid = NULL
    WHERE l.token IS NULL OR l.expires_at <= clock_timestamp()
  RETURNING l.fence)
SELECT true, fence, NULL, NULL, NULL, NULL FROM granted
UNION ALL
SELECT false, l.fence, l.holder,
       concat(left(l.token, 8), substring(l.token from ':kept$')), l.ttl_ms,
       greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases l
WHERE l.key = $1 AND l.token IS NOT NULL AND NOT EXISTS (SELECT 1 FROM granted))sql";

// Renews many grants in one statement. $1 keys, $2 owner tokens, $3 ttls in ms (arrays of the
// same length). A row is extended only while its token matches and it has not expired; the
// returned (key, token, NULL) rows are the renewals that took, every other request is lost.
// One more row (NULL, NULL, us): the server's wall clock in microseconds since the Unix epoch,
// read after the updates (the data-modifying CTE runs first): the clock expires_at is judged
// by, which the backend watches for steps (backends/common/store_clock.h).
inline constexpr std::string_view kTableRenewMany = R"sql(
WITH x AS (
  UPDATE {schema}.leases AS l
  SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond', ttl_ms = r.ttl_ms
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl_ms)
  WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp()
  RETURNING l.key, l.token)
SELECT key, token, NULL::bigint FROM x
UNION ALL
SELECT NULL, NULL, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)sql";

// Release, table mode. $1 key, $2 owner token. Clears the grant only if the token matches and
// it is live, and NOTIFYs the key on the schema's channel (delivered at commit, i.e. at once):
// one row means released, none means lost.
inline constexpr std::string_view kTableRelease = R"sql(
WITH released AS (
  UPDATE {schema}.leases
  SET token = NULL, holder = NULL, expires_at = NULL
  WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()
  RETURNING key)
SELECT pg_notify({channel}, key) FROM released)sql";

// Force-release, table mode. $1 key. As kTableRelease, whoever holds the key.
inline constexpr std::string_view kTableForceRelease = R"sql(
WITH released AS (
  UPDATE {schema}.leases
  SET token = NULL, holder = NULL, expires_at = NULL
  WHERE key = $1 AND token IS NOT NULL AND expires_at > clock_timestamp()
  RETURNING key)
SELECT pg_notify({channel}, key) FROM released)sql";

// Inspect and list, table mode: live grants only. $1 key (inspect) or prefix (list; starts_with
// takes it literally, so '%' and '_' in keys need no escaping). Ordered bytewise (COLLATE "C").
inline constexpr std::string_view kTableInspect = R"sql(
SELECT key, holder, concat(left(token, 8), substring(token from ':kept$')), fence, ttl_ms,
       greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases
WHERE key = $1 AND token IS NOT NULL AND expires_at > clock_timestamp())sql";

inline constexpr std::string_view kTableList = R"sql(
SELECT key, holder, concat(left(token, 8), substring(token from ':kept$')), fence, ttl_ms,
       greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases
WHERE starts_with(key, $1) AND token IS NOT NULL AND expires_at > clock_timestamp()
ORDER BY key COLLATE "C")sql";

// The `recorded` part of kTableFinish and kAdvisoryFinish (filled in for {recorded}): replaces
// the key's record only if `ended` did something, in the same statement and transaction as the
// end of the grant, so the two commit together or not at all. $4 the record hex-encoded, $5 its
// ttl in ms.
inline constexpr std::string_view kFinishRecorded = R"sql(recorded AS (
  INSERT INTO {schema}.records AS r (key, value, expires_at)
  SELECT key, decode($4::text, 'hex'), clock_timestamp() + $5::bigint * interval '1 millisecond'
  FROM ended WHERE $4::text IS NOT NULL
  ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at))sql";

// In its place when there is no record: names $4 and $5 (the server must type every parameter
// sent) without touching the records table, so that a schema from before records can still
// keep grants.
inline constexpr std::string_view kFinishNoRecord =
    R"sql(recorded AS (SELECT $4::text AS value, $5::bigint AS ttl_ms))sql";

// Finish, table mode. $1 key, $2 owner token, $3 keep in ms ('0': clear the grant, as
// kTableRelease), $4 the record hex-encoded (NULL: none), $5 the record's ttl in ms.
// - `ended` changes the row only if the token matches and the grant is live: with a keep, its
//   expiry moves and its token gains ':kept' (holder and fence stay, so it is still the same
//   grant, but a renewal of the owner's already in flight no longer matches it and cannot
//   extend or shorten it); without, the grant's columns are cleared.
// - `recorded` (kFinishRecorded, or kFinishNoRecord) writes the record.
// - NOTIFY either way: after a clear a waiter takes over; after a keep, waiters re-read the
//   shorter remaining time. One row means finished, none means lost.
inline constexpr std::string_view kTableFinish = R"sql(
WITH ended AS (
  UPDATE {schema}.leases AS l
  SET token = CASE WHEN $3::bigint > 0 THEN l.token || ':kept' END,
      holder = CASE WHEN $3::bigint > 0 THEN l.holder END,
      ttl_ms = CASE WHEN $3::bigint > 0 THEN $3::bigint ELSE l.ttl_ms END,
      expires_at = CASE WHEN $3::bigint > 0
                        THEN clock_timestamp() + $3::bigint * interval '1 millisecond' END
  WHERE l.key = $1 AND l.token = $2 AND l.expires_at > clock_timestamp()
  RETURNING l.key),
{recorded}
SELECT pg_notify({channel}, key) FROM ended)sql";

// Remaining time of the key's live grant in ms, or no row if it is free: how long a waiter may
// sleep before the grant expires by itself.
inline constexpr std::string_view kTableRemaining = R"sql(
SELECT greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases
WHERE key = $1 AND token IS NOT NULL AND expires_at > clock_timestamp())sql";

// A fenced write's check, table mode, the first statement of its transaction (kBegin). $1 key,
// $2 owner token, $3 fencing token. A row only if the key's row is still this grant (token and
// fence) and live on the server's clock. FOR SHARE locks that row until the transaction ends:
// every statement that could end or take over the grant (kTableAcquire's ON CONFLICT DO UPDATE,
// kTableRenewMany, kTableRelease, kTableForceRelease, kTableFinish: all UPDATE it) waits for the
// write's COMMIT, and an acquirer then re-reads the row, so no new grant begins before the write
// is in. (A grant that expires during the write is taken over only after it, as if the write had
// been quicker.)
inline constexpr std::string_view kTableFencedCheck = R"sql(
SELECT 1 FROM {schema}.leases
WHERE key = $1 AND token = $2 AND fence = $3::bigint AND expires_at > clock_timestamp()
FOR SHARE)sql";

// The waiters' channel: one per schema, payload = the released key.
inline constexpr std::string_view kListen = R"sql(LISTEN {schema_ident})sql";

// ---- table mode with the shares table (shared leases) ----
//
// With the shares table (kCreateSharesTable) ready, table mode keeps an exclusive grant where it
// always was, in the key's `leases` row (slot 0), and shared and semaphore grants in `shares`.
// kTableAcquire (above) still serves a plain exclusive try-acquire in one statement: it refuses a
// row with the marker, and then kTableAcquireShared decides. Every other statement below covers
// both tables.

// Try-acquire of any kind, table mode: one simple query of three statements, which PostgreSQL
// runs as one implicit transaction (all or nothing), under READ COMMITTED, where each statement
// takes a new snapshot. Literals, not parameters (several statements cannot take parameters):
// {key}, {token}, {holder}, {waiter} (NULL without one) quoted by PgLiteral, {ttl_ms} and
// {limit} numbers, {mode} 'x' (exclusive) or 's' (shared).
// 1. Locks the key's row in `leases` (creating it with fence 0 if new) until COMMIT. Every
//    statement that admits a grant of the key (this one, kTableAcquire) or writes its intent
//    holds that lock, so admissions of a key are serialised.
// 2. Deletes the key's expired rows in `shares` (grants and the intent). DELETE re-checks each
//    row's expiry on its newest version after waiting for a renewal writing it, so a grant
//    renewed at the last moment survives.
// 3. Decides, from a snapshot taken after 1 and 2: every transaction that admitted a grant of the
//    key before has committed (it held the lock), so every grant is seen. Every remaining row of
//    the key in `shares` counts as live (one that expires in the microseconds since 2 or is being
//    released counts too: a refusal, never an over-admission). The exclusive grant is the key
//    row's own (not the marker, live). Then, as Ahead::Decide (common/admission.h), live grants
//    ahead: `mismatch` when one is of the other family or another limit; admitted when there is
//    room; a refused exclusive request with a waiter records (or refreshes) its intent unless
//    another waiter's is live; a granted one deletes its own. The key row's fence moves by one
//    for every grant (the key's single counter), and its token becomes the new exclusive grant's
//    or the marker. Slot: 0 for an exclusive grant, else the smallest number no row has.
// Returns one row: outcome ('granted', 'held', 'mismatch'), the new fence, the slot; then the
// refusing grant: holder, token prefix, fence, ttl_ms, remaining_ms, mode ('x'/'s'), lim, slot
// (the live grant of the lowest slot, or for a shared request refused by an intent the waiting
// writer, fence 0 and no token).
inline constexpr std::string_view kTableAcquireShared = R"sql(
INSERT INTO {schema}.leases AS l (key, fence) VALUES ({key}, 0)
  ON CONFLICT (key) DO UPDATE SET fence = l.fence;
DELETE FROM {schema}.shares WHERE key = {key} AND expires_at <= clock_timestamp();
WITH k AS (SELECT * FROM {schema}.leases WHERE key = {key}),
g AS (SELECT * FROM {schema}.shares WHERE key = {key} AND slot >= 0),
i AS (SELECT * FROM {schema}.shares
      WHERE key = {key} AND slot = -1 AND token IS DISTINCT FROM {waiter}),
f AS (
  SELECT * FROM (
    SELECT holder, concat(left(token, 8), substring(token from ':kept$')) AS prefix, fence,
           ttl_ms, expires_at, 'x' AS mode, 1 AS lim,
           0 AS slot
    FROM k WHERE token IS NOT NULL AND token <> )sql" LH_PG_SHARED_MARKER R"sql(
      AND expires_at > clock_timestamp()
    UNION ALL
    SELECT holder, concat(left(token, 8), substring(token from ':kept$')), fence, ttl_ms,
           expires_at,
           CASE WHEN lim = 1 THEN 's' ELSE 'x' END, lim, slot
    FROM g) a
  ORDER BY slot LIMIT 1),
r AS (SELECT {mode}::text AS mode, {limit}::integer AS lim, {waiter}::text AS waiter),
d AS (
  SELECT r.*, f.holder, f.prefix, f.fence, f.ttl_ms, f.expires_at, f.mode AS hmode,
         f.lim AS hlim, f.slot AS hslot,
         f.lim IS NOT NULL AND ((f.lim > 1) <> (r.lim > 1) OR (r.lim > 1 AND f.lim <> r.lim))
           AS mismatch,
         (SELECT count(*) FROM g) AS n,
         EXISTS (SELECT 1 FROM i) AS intent,
         -- This owner token holds a grant of the key already (an earlier attempt of the same
         -- Acquire whose reply was lost, re-sent): held, never a second slot.
         EXISTS (SELECT 1 FROM g WHERE token = {token})
           OR EXISTS (SELECT 1 FROM k WHERE token = {token}) AS mine
  FROM r LEFT JOIN f ON true),
e AS (
  SELECT d.*,
         NOT d.mismatch AND NOT d.mine AND CASE
           WHEN d.lim > 1 THEN d.n < d.lim
           WHEN d.mode = 'x' THEN d.hlim IS NULL
           ELSE (d.hlim IS NULL OR d.hmode = 's') AND NOT d.intent END AS admit,
         d.mode = 'x' AND d.lim = 1 AS excl
  FROM d),
u AS (
  UPDATE {schema}.leases AS l
  SET fence = greatest(l.fence, )sql" LH_PG_EPOCH R"sql() + 1,
      token = CASE WHEN e.excl THEN {token} ELSE )sql" LH_PG_SHARED_MARKER R"sql( END,
      holder = CASE WHEN e.excl THEN {holder} ELSE )sql" LH_PG_SHARED_HOLDER R"sql( END,
      ttl_ms = CASE WHEN e.excl THEN {ttl_ms}::bigint END,
      expires_at = CASE WHEN e.excl
                        THEN clock_timestamp() + {ttl_ms}::bigint * interval '1 millisecond'
                        ELSE )sql" LH_PG_SHARED_MARKER_UNTIL R"sql( END,
      lock_id = NULL, pid = NULL
  FROM e WHERE l.key = {key} AND e.admit
  RETURNING l.fence),
s AS (
  SELECT CASE WHEN e.excl THEN 0
              ELSE (SELECT min(v) FROM generate_series(0, e.n::integer) v
                    WHERE v NOT IN (SELECT slot FROM g)) END AS slot
  FROM e),
granted AS (
  INSERT INTO {schema}.shares (key, slot, token, holder, ttl_ms, expires_at, fence, lim)
  SELECT {key}, s.slot, {token}, {holder}, {ttl_ms}::bigint,
         clock_timestamp() + {ttl_ms}::bigint * interval '1 millisecond', u.fence, e.lim
  FROM e, s, u WHERE NOT e.excl
  RETURNING slot),
cleared AS (
  DELETE FROM {schema}.shares
  WHERE key = {key} AND slot = -1 AND token = {waiter} AND EXISTS (SELECT 1 FROM u)),
intent AS (
  INSERT INTO {schema}.shares AS o (key, slot, token, holder, ttl_ms, expires_at, fence, lim)
  SELECT {key}, -1, e.waiter, {holder}, {ttl_ms}::bigint,
         clock_timestamp() + {ttl_ms}::bigint * interval '1 millisecond', 0, 0
  FROM e WHERE e.excl AND e.waiter IS NOT NULL AND NOT e.admit AND NOT e.mismatch
    AND NOT e.intent
  ON CONFLICT (key, slot) DO UPDATE
    SET holder = EXCLUDED.holder, ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at
    WHERE o.token = EXCLUDED.token)
SELECT CASE WHEN e.mismatch THEN 'mismatch' WHEN e.admit THEN 'granted' ELSE 'held' END,
       (SELECT fence FROM u), s.slot,
       CASE WHEN by_intent THEN i.holder ELSE e.holder END,
       CASE WHEN by_intent THEN '' ELSE e.prefix END,
       CASE WHEN by_intent THEN 0 ELSE e.fence END,
       CASE WHEN by_intent THEN i.ttl_ms ELSE e.ttl_ms END,
       greatest(0, ceil(extract(epoch FROM
         CASE WHEN by_intent THEN i.expires_at ELSE e.expires_at END - clock_timestamp())
         * 1000))::bigint,
       CASE WHEN by_intent THEN 'x' ELSE e.hmode END,
       CASE WHEN by_intent THEN 1 ELSE e.hlim END,
       CASE WHEN by_intent THEN 0 ELSE e.hslot END
FROM e CROSS JOIN s LEFT JOIN i ON true,
     LATERAL (SELECT NOT e.admit AND NOT e.mismatch AND e.mode = 's' AND e.lim = 1
                     AND (e.hlim IS NULL OR e.hmode = 's') AND i.token IS NOT NULL
                     AS by_intent) b)sql";

// Renews many grants in one statement, both tables. $1 keys, $2 owner tokens, $3 ttls in ms
// (arrays of the same length). As kTableRenewMany: a grant is extended only while its token
// matches and it has not expired; the returned (key, token, NULL) rows are the renewals that
// took, and one (NULL, NULL, us) row is the server's wall clock.
inline constexpr std::string_view kTableRenewManyShared = R"sql(
WITH r AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl_ms)),
x AS (
  UPDATE {schema}.leases AS l
  SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond', ttl_ms = r.ttl_ms
  FROM r
  WHERE l.key = r.key AND l.token = r.token AND l.expires_at > clock_timestamp()
  RETURNING l.key, l.token),
s AS (
  UPDATE {schema}.shares AS l
  SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond', ttl_ms = r.ttl_ms
  FROM r
  WHERE l.key = r.key AND l.slot >= 0 AND l.token = r.token
    AND l.expires_at > clock_timestamp()
  RETURNING l.key, l.token)
SELECT key, token, NULL::bigint FROM x UNION ALL SELECT key, token, NULL FROM s
UNION ALL
SELECT NULL, NULL, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)sql";

// Release, table mode, both tables. $1 key, $2 owner token. Ends the grant only if the token
// matches and it is live, and NOTIFYs the key: one row means released, none means lost. The
// marker stays on the key's row (kTableAcquireShared clears it).
inline constexpr std::string_view kTableReleaseShared = R"sql(
WITH x AS (
  UPDATE {schema}.leases
  SET token = NULL, holder = NULL, expires_at = NULL
  WHERE key = $1 AND token = $2 AND expires_at > clock_timestamp()
  RETURNING key),
s AS (
  DELETE FROM {schema}.shares
  WHERE key = $1 AND slot >= 0 AND token = $2 AND expires_at > clock_timestamp()
  RETURNING key)
SELECT pg_notify({channel}, key) FROM (SELECT key FROM x UNION ALL SELECT key FROM s) e)sql";

// Force-release, table mode, both tables. $1 key, $2 an owner token prefix (NULL: every grant).
// Ends the key's live grants (whose token starts with $2), whoever holds them, leaving the fence
// and the marker, and NOTIFYs once if any was ended: one row means something was released.
inline constexpr std::string_view kTableForceReleaseShared = R"sql(
WITH x AS (
  UPDATE {schema}.leases
  SET token = NULL, holder = NULL, expires_at = NULL
  WHERE key = $1 AND token IS NOT NULL AND token <> )sql" LH_PG_SHARED_MARKER R"sql(
    AND expires_at > clock_timestamp() AND ($2::text IS NULL OR starts_with(token, $2::text))
  RETURNING key),
s AS (
  DELETE FROM {schema}.shares
  WHERE key = $1 AND slot >= 0 AND expires_at > clock_timestamp()
    AND ($2::text IS NULL OR starts_with(token, $2::text))
  RETURNING key)
SELECT pg_notify({channel}, $1)
WHERE EXISTS (SELECT 1 FROM x) OR EXISTS (SELECT 1 FROM s))sql";

// The live grants of a key (`key = $1`) or of keys with a prefix (starts_with), from both
// tables: (key, holder, token prefix, fence, ttl_ms, remaining_ms, mode, lim, slot), for
// kTableHolders and kTableListShared. {where} is the condition on `key`.
#define LH_PG_TABLE_GRANTS(where)                                                          \
  "SELECT key, holder, concat(left(token, 8), substring(token from ':kept$')) AS prefix, " \
  "fence, ttl_ms, "                                                                        \
  "greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint, " \
  "'x' AS mode, 1 AS lim, 0 AS slot FROM {schema}.leases "                                 \
  "WHERE " where " AND token IS NOT NULL AND token <> " LH_PG_SHARED_MARKER                \
  " "                                                                                      \
  "AND expires_at > clock_timestamp() "                                                    \
  "UNION ALL "                                                                             \
  "SELECT key, holder, concat(left(token, 8), substring(token from ':kept$')), fence, "    \
  "ttl_ms, "                                                                               \
  "greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint, " \
  "CASE WHEN lim = 1 THEN 's' ELSE 'x' END, lim, slot FROM {schema}.shares "               \
  "WHERE " where " AND slot >= 0 AND expires_at > clock_timestamp()"

// Every live grant of key $1, ordered by slot (Inspect takes the first), then its live writer
// intent (slot -1 in shares) as mode 'w': no token prefix, fencing token 0.
inline constexpr std::string_view kTableHolders =
    "SELECT * FROM (" LH_PG_TABLE_GRANTS("key = $1") " UNION ALL "
    "SELECT key, holder, '', 0, ttl_ms, "
    "greatest(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint, "
    "'w', 1, -1 FROM {schema}.shares "
    "WHERE key = $1 AND slot = -1 AND expires_at > clock_timestamp()) a "
    "ORDER BY slot < 0, slot";

// Every live grant of the keys that start with $1, ordered bytewise by key, then by slot.
inline constexpr std::string_view kTableListShared =
    "SELECT * FROM (" LH_PG_TABLE_GRANTS("starts_with(key, $1)") ") a "
    "ORDER BY key COLLATE \"C\", slot";

// Finish, table mode, both tables. Parameters and {recorded} as kTableFinish. A shared or
// semaphore grant kept (keep > 0) keeps its row and slot with token || ':kept' and the keep's
// expiry; without a keep its row is deleted.
inline constexpr std::string_view kTableFinishShared = R"sql(
WITH x AS (
  UPDATE {schema}.leases AS l
  SET token = CASE WHEN $3::bigint > 0 THEN l.token || ':kept' END,
      holder = CASE WHEN $3::bigint > 0 THEN l.holder END,
      ttl_ms = CASE WHEN $3::bigint > 0 THEN $3::bigint ELSE l.ttl_ms END,
      expires_at = CASE WHEN $3::bigint > 0
                        THEN clock_timestamp() + $3::bigint * interval '1 millisecond' END
  WHERE l.key = $1 AND l.token = $2 AND l.expires_at > clock_timestamp()
  RETURNING l.key),
kept AS (
  UPDATE {schema}.shares AS l
  SET token = l.token || ':kept', ttl_ms = $3::bigint,
      expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
  WHERE l.key = $1 AND l.slot >= 0 AND l.token = $2 AND l.expires_at > clock_timestamp()
    AND $3::bigint > 0
  RETURNING l.key),
dropped AS (
  DELETE FROM {schema}.shares AS l
  WHERE l.key = $1 AND l.slot >= 0 AND l.token = $2 AND l.expires_at > clock_timestamp()
    AND $3::bigint <= 0
  RETURNING l.key),
ended AS (SELECT key FROM x UNION ALL SELECT key FROM kept UNION ALL SELECT key FROM dropped),
{recorded}
SELECT pg_notify({channel}, key) FROM ended)sql";

// How long a waiter of key $1 may sleep before something ends by itself: the earliest expiry in
// ms among the key's live grants and its writer intent unless that is $2's (the waiter's own
// id, NULL for none); no row if there is none of them.
inline constexpr std::string_view kTableRemainingShared = R"sql(
SELECT greatest(0, ceil(extract(epoch FROM min(expires_at) - clock_timestamp()) * 1000))::bigint
FROM (
  SELECT expires_at FROM {schema}.leases
  WHERE key = $1 AND token IS NOT NULL AND token <> )sql" LH_PG_SHARED_MARKER R"sql(
    AND expires_at > clock_timestamp()
  UNION ALL
  SELECT expires_at FROM {schema}.shares
  WHERE key = $1 AND expires_at > clock_timestamp()
    AND (slot >= 0 OR token IS DISTINCT FROM $2::text)) a
HAVING count(*) > 0)sql";

// A fenced write's check, table mode, both tables (as kTableFencedCheck): a row only if the
// grant is still this one and live, locked FOR SHARE until the write's transaction ends (a share
// row's release, renewal or expiry deletion waits for it).
inline constexpr std::string_view kTableFencedCheckShared = R"sql(
WITH x AS (
  SELECT 1 FROM {schema}.leases
  WHERE key = $1 AND token = $2 AND fence = $3::bigint AND expires_at > clock_timestamp()
  FOR SHARE),
s AS (
  SELECT 1 FROM {schema}.shares
  WHERE key = $1 AND slot >= 0 AND token = $2 AND fence = $3::bigint
    AND expires_at > clock_timestamp()
  FOR SHARE)
SELECT 1 FROM x UNION ALL SELECT 1 FROM s)sql";

// Withdraws waiter $2's writer intent on key $1 (Backend::AbandonWait) and NOTIFYs the key, so
// that shared waiters it held off try again.
inline constexpr std::string_view kTableAbandonIntent = R"sql(
WITH gone AS (
  DELETE FROM {schema}.shares WHERE key = $1 AND slot = -1 AND token = $2 RETURNING key)
SELECT pg_notify({channel}, key) FROM gone)sql";

// ---- advisory mode ----

// The advisory locks this session holds, as pg_locks shows them (granted, bigint form, this
// database).
#define LH_PG_HELD_BY_ME \
  "SELECT " LH_PG_LOCK_ID_OF("k") " AS lock_id FROM pg_locks k "                           \
  "WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.granted "                        \
  "AND k.pid = pg_backend_pid() "                                                          \
  "AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())"

// Whether the session `pid_expr` holds the advisory lock `id_expr`.
#define LH_PG_LOCK_HELD(pid_expr, id_expr)                                             \
  "EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.objsubid = 1 " \
  "AND k.granted AND k.pid = " pid_expr " AND " LH_PG_LOCK_ID_OF(                      \
      "k") " = " id_expr                                                               \
           " "                                                                         \
           "AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"

// Try-acquire, advisory mode. $1 key, $2 owner token, $3 holder, $4 ttl in ms, $5 lock id,
// $6 idle_session_timeout, $7 tcp_keepalives_idle, $8 tcp_user_timeout (the session limits of
// postgres_advisory_backend.h, computed by the backend for the largest TTL on the session).
// - `limits` raises the session's TCP limits first, so that they hold before the lock does.
// - `lock` then takes the session-level advisory lock if free (MATERIALIZED: evaluated once).
// - `granted` bumps the key's fence and records the grant only if the lock was taken and the
//   row is not a live kept grant (LH_PG_KEPT, judged on the row's newest version: see the top
//   of this file): both in one statement, so the fence moves exactly with the grant.
// - `holder` is the grant that refuses us, read from the row alone (no pg_locks scan, which
//   cost 5-7 round trips' worth of server time on this path). When pg_try_advisory_lock failed,
//   a live session holds the lock (a session's advisory locks end with it), so the row's
//   grant names it. The name can be a moment stale: a release leaves its row as is and the
//   next holder's grant statement (or a waiter's kAdvisoryGrantHeld, sent just after its
//   queued lock was granted) may not be committed or visible to this statement's snapshot
//   yet, so the previous holder is named, or none when a finish cleared the row (holder
//   unknown). Nothing is decided by the name: the refusal itself comes from the lock. When the
//   lock was taken (free), only a live kept grant refuses, and it is named (LH_PG_KEPT).
// - The result is always one row, from `lock`: (granted, fence, then NULLs) after a grant, when
//   it also sets idle_session_timeout (only a session that holds leases gets an idle limit);
//   (false, the holder's fence, holder, token prefix, ttl, remaining) when refused, or all NULL
//   if the holder is unknown. Its last column unlocks again a lock taken for a grant that a
//   kept row refused: in the select list of the one row, so it surely runs, once.
// Note: a session-level advisory lock survives an error of the statement that took it, so the
// backend unlocks after any error of this statement.
inline constexpr std::string_view kAdvisoryAcquire = R"sql(
WITH limits AS MATERIALIZED (
  SELECT set_config('tcp_keepalives_idle', $7, false),
         set_config('tcp_keepalives_interval', '1', false),
         set_config('tcp_keepalives_count', '1', false),
         set_config('tcp_user_timeout', $8, false)),
lock AS MATERIALIZED (SELECT pg_try_advisory_lock($5::bigint) AS got FROM limits),
granted AS (
  INSERT INTO {schema}.leases AS l (key, fence, token, holder, ttl_ms, expires_at, lock_id, pid)
  SELECT $1, )sql" LH_PG_EPOCH R"sql( + 1, $2, $3, $4::bigint,
         clock_timestamp() + $4::bigint * interval '1 millisecond', $5::bigint, pg_backend_pid()
  FROM lock WHERE got
  ON CONFLICT (key) DO UPDATE
    SET fence = greatest(l.fence, )sql" LH_PG_EPOCH R"sql() + 1, token = EXCLUDED.token,
        holder = EXCLUDED.holder, ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at,
        lock_id = EXCLUDED.lock_id, pid = EXCLUDED.pid
    WHERE NOT )sql" LH_PG_KEPT("l") R"sql(
  RETURNING l.fence),
holder AS (
  SELECT l.fence, l.holder,
         concat(left(l.token, 8), substring(l.token from ':kept$')) AS token_prefix, l.ttl_ms,
         greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint
           AS remaining_ms
  FROM {schema}.leases l, lock k
  WHERE l.key = $1 AND l.token IS NOT NULL AND (NOT k.got OR )sql" LH_PG_KEPT("l") R"sql()
  LIMIT 1)
SELECT g.fence IS NOT NULL, coalesce(g.fence, h.fence),
       CASE WHEN g.fence IS NOT NULL THEN set_config('idle_session_timeout', $6, false)
            ELSE h.holder END,
       h.token_prefix, h.ttl_ms, h.remaining_ms,
       CASE WHEN k.got AND g.fence IS NULL THEN pg_advisory_unlock($5::bigint) END
FROM lock k
LEFT JOIN granted g ON true
LEFT JOIN holder h ON g.fence IS NULL)sql";

// Completes a grant whose lock this session already holds (it waited in the server's lock
// queue: kAdvisoryWait). Parameters as kAdvisoryAcquire. Sets the session's TCP limits, then
// bumps the fence and records the grant, in one statement, unless the row is a live kept grant
// (as kAdvisoryAcquire); idle_session_timeout is set only with a grant (RETURNING runs only for
// the row written), since a waiter that keeps the lock until a kept grant ends sends nothing
// meanwhile. Returns (true, fence) when granted, (false, fence, holder, token prefix, ttl,
// remaining) when a kept grant refuses, or no row when the refusal's row is not yet visible to
// this statement's snapshot (a finish that committed while the statement waited for it).
inline constexpr std::string_view kAdvisoryGrantHeld = R"sql(
WITH limits AS MATERIALIZED (
  SELECT set_config('tcp_keepalives_idle', $7, false),
         set_config('tcp_keepalives_interval', '1', false),
         set_config('tcp_keepalives_count', '1', false),
         set_config('tcp_user_timeout', $8, false)),
granted AS (
  INSERT INTO {schema}.leases AS l (key, fence, token, holder, ttl_ms, expires_at, lock_id, pid)
  SELECT $1, )sql" LH_PG_EPOCH R"sql( + 1, $2, $3, $4::bigint,
         clock_timestamp() + $4::bigint * interval '1 millisecond', $5::bigint, pg_backend_pid()
  FROM limits
  ON CONFLICT (key) DO UPDATE
    SET fence = greatest(l.fence, )sql" LH_PG_EPOCH R"sql() + 1, token = EXCLUDED.token,
        holder = EXCLUDED.holder, ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at,
        lock_id = EXCLUDED.lock_id, pid = EXCLUDED.pid
    WHERE NOT )sql" LH_PG_KEPT("l") R"sql(
  RETURNING l.fence, set_config('idle_session_timeout', $6, false))
SELECT true, fence, NULL, NULL, NULL::bigint, NULL::bigint FROM granted
UNION ALL
SELECT false, l.fence, l.holder,
       concat(left(l.token, 8), substring(l.token from ':kept$')), l.ttl_ms,
       greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases l
WHERE l.key = $1 AND NOT EXISTS (SELECT 1 FROM granted) AND )sql" LH_PG_KEPT("l");

// Waits in the server's lock queue for the lock {lock_id}: SET LOCAL applies lock_timeout to
// this statement only (several statements in one simple query form one implicit transaction),
// so a forgotten wait ends by itself after {timeout_ms}. 55P03 = timed out; 57014 = cancelled.
inline constexpr std::string_view kAdvisoryWait =
    "SET LOCAL lock_timeout = {timeout_ms}; SELECT pg_advisory_lock({lock_id})";

// Unlocks {lock_id} once (after a failed acquire, or an abandoned wait that got the lock).
inline constexpr std::string_view kAdvisoryUnlock = "SELECT pg_advisory_unlock({lock_id})";

// Heartbeat, advisory mode: one statement per session for all its leases. $1 keys, $2 owner
// tokens, $3 ttls in ms. Returns tagged rows:
// - ('pid', pg_backend_pid()): must be the session's pid from connect, or a pooler swapped the
//   session under us;
// - ('lock', id) for every advisory lock the session holds (pg_locks);
// - ('renewed', key) for every row still recorded as this session's grant with this token,
//   whose expires_at (shown by status/list) moves to now + ttl.
inline constexpr std::string_view kAdvisoryRenewMany = R"sql(
WITH renewed AS (
  UPDATE {schema}.leases AS l
  SET expires_at = clock_timestamp() + r.ttl_ms * interval '1 millisecond', ttl_ms = r.ttl_ms
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl_ms)
  WHERE l.key = r.key AND l.token = r.token AND l.pid = pg_backend_pid()
  RETURNING l.key)
SELECT 'pid', pg_backend_pid()::text
UNION ALL SELECT 'lock', lock_id::text FROM ()sql" LH_PG_HELD_BY_ME R"sql() held
UNION ALL SELECT 'renewed', key FROM renewed)sql";

// Release, advisory mode. $1 lock id, $2 the session's idle limit for the leases it keeps
// ('0': none left, no limit). Unlocks: the next waiter in the server's queue gets the lock at
// once. The row is left as is on purpose: writing it would make the next holder's grant wait
// for this statement's commit (a row lock, and a WAL flush with synchronous_commit on), and a
// row whose session no longer holds the lock already counts as no grant (kAdvisoryInspect); the
// next grant overwrites it. Returns whether the lock was held by this session.
inline constexpr std::string_view kAdvisoryRelease = R"sql(
SELECT pg_advisory_unlock($1::bigint), set_config('idle_session_timeout', $2, false))sql";

// Finish, advisory mode. $1 key, $2 owner token, $3 keep in ms ('0': clear the grant), $4 the
// record hex-encoded (NULL: none), $5 the record's ttl in ms, $6 lock id, $7 the session's idle
// limit for the leases it keeps afterwards (as kAdvisoryRelease).
// - `ended` changes the row only if it records this token as this session's grant and this
//   session holds the lock (pg_locks): the owner check. With a keep, the row becomes a kept
//   grant (pid and lock_id NULL, expires_at at the end of the keep; token, holder and fence
//   stay); without, its grant's columns are cleared. Unlike kAdvisoryRelease it always writes
//   the row: that row lock is what makes the next grant wait for this commit (top of file).
// - `recorded` writes the record, as in kTableFinish.
// - The select list unlocks, after `ended` produced its row: the next waiter in the server's
//   queue gets the lock at once, and its grant statement waits for this commit.
// One row means finished, none means lost (nothing written, nothing unlocked).
inline constexpr std::string_view kAdvisoryFinish = R"sql(
WITH ended AS (
  UPDATE {schema}.leases AS l
  SET token = CASE WHEN $3::bigint > 0 THEN l.token || ':kept' END,
      holder = CASE WHEN $3::bigint > 0 THEN l.holder END,
      ttl_ms = CASE WHEN $3::bigint > 0 THEN $3::bigint ELSE l.ttl_ms END,
      expires_at = CASE WHEN $3::bigint > 0
                        THEN clock_timestamp() + $3::bigint * interval '1 millisecond' END,
      pid = NULL, lock_id = NULL
  WHERE l.key = $1 AND l.token = $2 AND l.pid = pg_backend_pid() AND l.lock_id = $6::bigint
    AND )sql" LH_PG_LOCK_HELD("pg_backend_pid()", "$6::bigint") R"sql(
  RETURNING l.key),
{recorded}
SELECT pg_advisory_unlock($6::bigint), set_config('idle_session_timeout', $7, false)
FROM ended)sql";

// Force-release, advisory mode. $1 key, $2 lock id. An advisory lock can only be freed by its
// own session, so the operator's break-glass ends that session: pg_terminate_backend(pid, 3000)
// waits up to 3 s for it to exit (every lease on it is lost; its holder finds out at its next
// heartbeat). The row's grant is cleared, a kept one too (no session holds that: the last
// branch reports it). Needs the holder's role, or pg_signal_backend.
inline constexpr std::string_view kAdvisoryForceRelease = R"sql(
WITH cleared AS (
  UPDATE {schema}.leases AS l
  SET token = NULL, holder = NULL, expires_at = NULL, pid = NULL, lock_id = NULL
  FROM {schema}.leases AS o
  WHERE l.key = $1 AND o.key = l.key
  RETURNING )sql" LH_PG_KEPT("o") R"sql( AS kept),
target AS (
  SELECT k.pid FROM pg_locks k
  WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.granted
    AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND )sql" LH_PG_LOCK_ID_OF("k") R"sql( = $2::bigint AND k.pid <> pg_backend_pid())
SELECT pid, pg_terminate_backend(pid, 3000), (SELECT count(*) FROM cleared) FROM target
UNION ALL
SELECT NULL::integer, NULL::boolean, 1::bigint FROM cleared
WHERE kept AND NOT EXISTS (SELECT 1 FROM target))sql";

// Inspect and list, advisory mode: rows whose recorded session holds the lock now (pg_locks)
// and whose holder renewed within its ttl, and live kept grants (no session: pid NULL). $1 key
// or prefix.
inline constexpr std::string_view kAdvisoryInspect = R"sql(
SELECT l.key, l.holder, concat(left(l.token, 8), substring(l.token from ':kept$')), l.fence,
       l.ttl_ms,
       greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases l
WHERE l.key = $1 AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
  AND (l.pid IS NULL OR )sql" LH_PG_LOCK_HELD("l.pid", "l.lock_id") ")";

inline constexpr std::string_view kAdvisoryList = R"sql(
SELECT l.key, l.holder, concat(left(l.token, 8), substring(l.token from ':kept$')), l.fence,
       l.ttl_ms,
       greatest(0, ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000))::bigint
FROM {schema}.leases l
WHERE starts_with(l.key, $1) AND l.token IS NOT NULL AND l.expires_at > clock_timestamp()
  AND (l.pid IS NULL OR )sql" LH_PG_LOCK_HELD("l.pid", "l.lock_id") R"sql()
ORDER BY l.key COLLATE "C")sql";

// A fenced write's check, advisory mode, the first statement of its transaction (kBegin) on the
// session that holds the lease: $1 key, $2 owner token, $3 fencing token, $4 lock id. A row
// only if this session holds the advisory lock (pg_locks, as kAdvisoryRenewMany reads it) and
// the key's row records this grant as this session's. Nothing else can end the grant meanwhile:
// only this session can unlock, and the backend runs nothing else on it until COMMIT; the end of
// the session (pg_terminate_backend, force-release) aborts the write with it.
inline constexpr std::string_view kAdvisoryFencedCheck = R"sql(
SELECT 1 FROM {schema}.leases l
WHERE l.key = $1 AND l.token = $2 AND l.fence = $3::bigint AND l.pid = pg_backend_pid()
  AND l.lock_id = $4::bigint AND )sql" LH_PG_LOCK_HELD("pg_backend_pid()", "$4::bigint");

// The fenced write's transaction (both modes), sent as simple queries: through PgBouncer in
// transaction pooling, everything from BEGIN to COMMIT or ROLLBACK runs on one server connection.
inline constexpr std::string_view kBegin = "BEGIN";
inline constexpr std::string_view kCommit = "COMMIT";
inline constexpr std::string_view kRollback = "ROLLBACK";

// The benchmark's and tests' reference round trip, and Backend::Ping's (both modes).
inline constexpr std::string_view kPing = "SELECT 1";

// Backend::Diagnose (both modes, PgDiagnose): what the store doctor asks the server, in one
// round trip. $1 the schema's name (unquoted). Columns:
//  0-3   fsync, synchronous_commit, full_page_writes, synchronous_standby_names: the session's
//        values (a per-role or per-database setting included: the one leasehold's statements
//        run with); current_setting(name, true) is NULL, not an error, where a server does not
//        have the setting;
//  4-5   server_version, server_version_num;
//  6     pg_is_in_recovery(): a standby refuses every write;
//  7     pg_backend_pid(), compared with the pid the connection got at startup (a pooler);
//  8     current_user, for the GRANT lines;
//  9-12  the schema exists; this role's USAGE and CREATE on it; CREATE on the database (to make
//        the schema);
//  13-16 leases exists; SELECT, INSERT, UPDATE on it (has_table_privilege with a list would be
//        true if any one is held, hence one call each);
//  17-20 the same for records;
//  21    the standbys streaming from this server ({replicas}: a count of pg_stat_replication,
//        whose rows every role sees, or NULL when the view is not readable at all);
//  22-26 shares exists; SELECT, INSERT, UPDATE, DELETE on it (shared leases, mode=table).
// The names are looked up in the catalogs rather than with to_regclass, which raises an error
// for a schema the role has no USAGE on; the has_*_privilege functions return NULL for a NULL
// oid (a missing object).
inline constexpr std::string_view kDiagnose = R"sql(
WITH s AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
t AS (SELECT c.relname, c.oid FROM pg_class c JOIN s ON c.relnamespace = s.oid
      WHERE c.relname IN ('leases', 'records', 'shares')),
l AS (SELECT (SELECT oid FROM t WHERE relname = 'leases') AS oid),
r AS (SELECT (SELECT oid FROM t WHERE relname = 'records') AS oid),
sh AS (SELECT (SELECT oid FROM t WHERE relname = 'shares') AS oid)
SELECT current_setting('fsync', true), current_setting('synchronous_commit', true),
       current_setting('full_page_writes', true),
       current_setting('synchronous_standby_names', true),
       current_setting('server_version', true), current_setting('server_version_num', true),
       pg_is_in_recovery(), pg_backend_pid(), current_user,
       (SELECT oid FROM s) IS NOT NULL, has_schema_privilege((SELECT oid FROM s), 'USAGE'),
       has_schema_privilege((SELECT oid FROM s), 'CREATE'),
       has_database_privilege(current_database(), 'CREATE'),
       l.oid IS NOT NULL, has_table_privilege(l.oid, 'SELECT'),
       has_table_privilege(l.oid, 'INSERT'), has_table_privilege(l.oid, 'UPDATE'),
       r.oid IS NOT NULL, has_table_privilege(r.oid, 'SELECT'),
       has_table_privilege(r.oid, 'INSERT'), has_table_privilege(r.oid, 'UPDATE'),
       {replicas},
       sh.oid IS NOT NULL, has_table_privilege(sh.oid, 'SELECT'),
       has_table_privilege(sh.oid, 'INSERT'), has_table_privilege(sh.oid, 'UPDATE'),
       has_table_privilege(sh.oid, 'DELETE'), )sql" LH_PG_TIMELINE R"sql(,
       (SELECT system_identifier FROM pg_control_system())::text,
       current_setting('cluster_name', true),
       EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'Patroni%')
FROM l, r, sh)sql";

// kDiagnose's {replicas}: the standbys streaming from this server, and how many of them are
// synchronous (sync_state sync or quorum); and its stand-in for a role that may not read
// pg_stat_replication.
inline constexpr std::string_view kDiagnoseReplicas =
    "(SELECT count(*) FROM pg_stat_replication), "
    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))";
inline constexpr std::string_view kDiagnoseNoReplicas = "NULL::bigint, NULL::bigint";

}  // namespace leasehold::internal::postgres_sql
