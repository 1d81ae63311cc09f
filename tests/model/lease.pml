/* File: tests/model/lease.pml
 *
 * A Promela model of leasehold's safety rule (DESIGN.md section 3), checked by spin
 * (tests/model/run.sh):
 *
 *   safe_until = t_send + ttl - drift      (t_send read BEFORE the request is sent)
 *
 * Properties, on the true time base (the ticks of Time(), which no process can read):
 *   1. for every key, no two holders' [acquired, safe_until) validity windows overlap: the
 *      LTL claim `safe` at the end, evaluated in every reachable state;
 *   2. a lease whose validity ended (lost, released, or its clock reached safe_until) is never
 *      valid again: the assertion in on_renew_result (the only step that raises safe_until).
 *
 * Which code each part stands for:
 *   Time()            true time, and one clock per process: each holder's Clock
 *                     (include/leasehold/clock.h, CLOCK_BOOTTIME in production) and the store's
 *                     own clock (Redis/SQL server time; MemoryTable's clock_ in
 *                     src/backends/memory/).
 *   Lease(i, k)       holder i's lease on key k: Store::TryAcquireAs (src/core/store.cc: t_send
 *                     read before backend.TryAcquire; the "granted only after its ttl" check),
 *                     the LeaseCore constructor (src/core/lease_core.cc: safe_until_ =
 *                     t_send + ttl - drift), Lease::Release / LeaseCore::BeginRelease, and the
 *                     expiry watchdog (Heartbeat::WatchdogLoop -> LeaseCore::CheckExpiry).
 *   Renewer(i)        holder i's heartbeat renew round (Heartbeat::RenewLoop,
 *                     src/heartbeat/heartbeat.cc): ONE t_send read before ONE RenewMany batch
 *                     of the holder's leases, then LeaseCore::OnRenewResult(t_send, result)
 *                     for each lease of the batch.
 *   StoreConn(i, k)   the store serving holder i's requests on key k, each one atomic as the
 *                     backends make it (Lua script, SQL statement; MemoryTable::TryAcquire,
 *                     ::Renew, ::Release): grant only if no live grant exists, renew and delete
 *                     only if the owner token matches, expiry on the store's own clock.
 *
 * State names are the code's (LeaseState, include/leasehold/lease_info.h): HELD, AT_RISK,
 * LOST. A lease is valid (Lease::valid(), LeaseCore::Valid) while it is not lost, not released
 * and its holder's clock reads < safe_until.
 *
 * Clocks. A clock reads true time + e, e in [0, EPS]. At every tick each e may move to any
 * value in that range that keeps the clock monotonic (the clock advances 0 .. EPS+1 ticks).
 * So over any interval a clock's measured length is within EPS of the true length, and two
 * clocks disagree about an interval by at most 2*EPS: the rate drift (and read granularity)
 * that the code's drift allowance (LeaseOptions::DefaultDrift: ttl/100 + 2 ms) must cover.
 * The model's allowance is DRIFT = 2*EPS, the exact bound: the control DRIFT=2*EPS-1 fails.
 *
 * Pauses and delays. Every action is one atomic step of one process, and nothing forces a
 * process to run (no fairness) while Time ticks on: any process can stop for any number of
 * ticks between any two of its steps, and every request and reply can be delayed for any
 * number of ticks (it waits in its slot until the receiver runs), or forever (lost).
 *
 * Time is unbounded. Every instant is kept relative to its clock's reading (su: safe_until -
 * Now(); sexp: expiry - the store's Now(); ages of t_send capped at ttl - drift, past which
 * nothing depends on them), and an owner token is kept as what matters about it: whether it
 * names the key's current grant (REF_CUR) or one the store no longer has (REF_OLD). The state
 * space is then finite with no horizon and no bound on the number of grants, so a complete
 * search covers runs of any length. The only bounds are NH, NK, TTL and EPS below.
 *
 * Over-approximations (each adds behaviours, so a proof here covers the code's schedule):
 *   - the renewer may start a round at any moment with any non-empty subset of the holder's
 *     leases that are not lost (the code renews at last t_send + renew_interval, batching those
 *     due within BatchSlack, and retries earlier after failures);
 *   - the store may process a batch's keys at different store times (a pipeline).
 * Left out, because each is covered by a behaviour the model has: an acquire request that is
 * lost (as if it was never sent); a grant or renewal whose reply is lost (the store state is
 * that of a delivered reply whose holder then pauses past safe_until).
 *
 * Negative controls (run.sh requires a counterexample from each):
 *   -DARRIVAL           an acquire's safe_until counts from the reply's arrival, not t_send;
 *   -DNODRIFT           no drift allowance while the clocks still drift;
 *   -DRENEW_FROM_REPLY  a renewal extends safe_until from the reply's arrival;
 *   -DNO_LATE_GUARD     OnRenewResult applies a success even at or after safe_until;
 *   -DDRIFT=n           any allowance below 2*EPS;
 *   -DRELEASE_BY_KEY    release deletes the key's grant whoever owns it.
 * -DNO_TRANSIENT leaves out the lost renew request (and with it AT_RISK), to size the search;
 * -DBATCH_ONE (with NK=2) gives key 1 to holder 0 alone, so that its batch of two leases is
 * checked against a contender on key 0 in a smaller state space (still far too large for CI:
 * tests/chaos/RESULTS.md, "Model").
 */

#ifndef NH
#define NH 2            /* holders (processes), each with its own clock */
#endif
#ifndef NK
#define NK 1            /* keys; every holder has one lease slot per key */
#endif
#ifndef EPS
#define EPS 1           /* per-clock error bound, ticks */
#endif
#ifndef TTL
#define TTL 3           /* the grant's TTL, ticks */
#endif
#ifdef NODRIFT
#define DRIFT 0
#endif
#ifndef DRIFT
#define DRIFT (2 * EPS) /* the code's drift allowance */
#endif
#define WIN (TTL - DRIFT)       /* a grant's validity on its holder's clock, from t_send */

#define NS (NH * NK)            /* lease slots */
#define IX(i, k) ((i) * NK + (k))
#define STORE NH                /* the store's clock index */

/* Lease slot phases: where the slot's Lease object is in its life. */
#define NONE 0      /* no Lease object: never acquired, or released, or LOST and dropped */
#define ACQ 1       /* Store::TryAcquire in flight */
#define ACTIVE 2    /* a Lease object that is not lost: state HELD or AT_RISK */

/* LeaseState of an ACTIVE lease. LOST is terminal: the object is dropped at once (ph = NONE)
 * and its release is in flight (a release that never arrives is one delayed forever). */
#define HELD 0
#define AT_RISK 1

/* Replies */
#define R_NONE 0
#define R_OK 1          /* granted / renewed */
#define R_NO 2          /* acquire: kHeldByAnother */
#define R_LOST 3        /* renew: kLost, token mismatch or expired */
#define R_UNAVAIL 4     /* renew: kUnavailable, the request was lost */

/* Renew round phases */
#define RB_IDLE 0
#define RB_SENT 1       /* RenewMany in flight: the store works through rmask */
#define RB_REPLIED 2    /* RenewMany returned */

/* A reference to a grant (an owner token held somewhere): 0 none, REF_CUR the key's current
 * grant at the store, REF_OLD a grant the store no longer has. */
#define REF_NONE 0
#define REF_CUR 1
#define REF_OLD 2

byte e[NH + 1];         /* clock errors: holders 0..NH-1, the store NH */

/* Holder side, per slot (LeaseCore) */
byte ph[NS];
byte st[NS];            /* LeaseCore::state_ */
byte su[NS];            /* safe_until_ - Now() on the holder's clock, 0 once passed */
byte tok[NS];           /* this Lease's owner token (a reference) */
byte aage[NS];          /* Now() - t_send of the acquire in flight, capped at WIN */

/* Acquire and release messages, per slot */
bit aq[NS];             /* acquire request in flight */
byte ar[NS];            /* acquire reply */
byte artok[NS];         /* the token it grants (a reference) */
byte rl[NS];            /* release request in flight: the token it carries (a reference) */

/* Renew round, per holder (Heartbeat::RenewLoop's batch) */
byte rb[NH];
byte rage[NH];          /* Now() - the round's t_send, capped at WIN */
byte rkeys[NH];         /* bit k: key k is in the batch */
byte rmask[NH];         /* bit k: key k not yet processed by the store */
byte rtok[NS];          /* the token sent for each key (RenewRequest::owner_token) */
bit rgone[NS];          /* the Lease object it was sent for was dropped meanwhile */
byte rres[NS];          /* the store's result for each key */

/* Store, per key */
byte sown[NK];          /* holder + 1 of the live grant, 0 = none */
byte sexp[NK];          /* its expiry - Now() on the store's clock */

#define VALID(s) (ph[s] == ACTIVE && su[s] > 0)

/* Time passes for clock c by d ticks of its own. */
#define DOWN(x, d) x = (x > d -> x - d : 0)
#define UP(x, d) x = (x + d < WIN -> x + d : WIN)

/* The key's grant ends (deleted or expired) or is replaced: every token of it goes stale. */
inline grant_ends(k) {
  gj = 0;
  do
  :: gj < NH ->
     gt = IX(gj, k);
     if :: tok[gt] == REF_CUR -> tok[gt] = REF_OLD :: else -> skip fi;
     if :: artok[gt] == REF_CUR -> artok[gt] = REF_OLD :: else -> skip fi;
     if :: rtok[gt] == REF_CUR -> rtok[gt] = REF_OLD :: else -> skip fi;
#ifdef RELEASE_BY_KEY
     if :: rl[gt] == REF_CUR -> rl[gt] = REF_OLD :: else -> skip fi;
#else
     rl[gt] = REF_NONE;   /* a stale release deletes nothing: as good as never sent */
#endif
     gj++
  :: else -> break
  od;
  sown[k] = 0; sexp[k] = 0; gj = 0; gt = 0
}

/* ---- Time: one tick of true time; every clock advances by a bounded-error amount. ---- */
/* (Steps are an atomic choice followed by a d_step: the deterministic rest is one transition,
 * which keeps the search shallow and quick.) */
active proctype Time() {
  byte c, d, j, t, x, gj, gt;
  byte ne[NH + 1];      /* the clocks' errors after this tick */
end:
  do
  :: atomic {
       c = 0;
       do
       :: c <= NH ->
          /* new error in [max(0, e-1), EPS]: the clock never runs backwards */
          ne[c] = (e[c] > 0 -> e[c] - 1 : 0);
          do
          :: ne[c] < EPS -> ne[c]++
          :: break
          od;
          c++
       :: else -> break
       od;
       d_step {
         c = 0;
         do
         :: c <= NH ->
            d = 1 + ne[c] - e[c]; e[c] = ne[c]; ne[c] = 0;
            if
            :: c < NH ->
               j = 0;
               do
               :: j < NK ->
                  t = IX(c, j); DOWN(su[t], d); UP(aage[t], d); j++
               :: else -> break
               od;
               UP(rage[c], d)
            :: else ->
               j = 0;
               do
               :: j < NK ->
                  if
                  :: sown[j] != 0 && sexp[j] <= d -> x = j; grant_ends(x)  /* expired */
                  :: sown[j] != 0 && sexp[j] > d -> sexp[j] = sexp[j] - d
                  :: else -> skip
                  fi;
                  j++
               :: else -> break
               od
            fi;
            c++
         :: else -> break
         od;
         c = 0; d = 0; j = 0; t = 0; x = 0
       }
     }
  od
}

/* Drop a Lease object (released, or lost: Lost is terminal, the caller acquires anew) and
 * send its release (delete only if ours). A round in flight for it is ignored. */
inline drop(s) {
  rl[s] = tok[s]; ph[s] = NONE; st[s] = HELD; su[s] = 0; tok[s] = REF_NONE;
  if :: rkeys[i] & (1 << k) -> rgone[s] = 1 :: else -> skip fi
}

/* ---- Lease(i, k): holder i's lease on key k: acquire, release, the watchdog. ---- */
proctype Lease(byte i; byte k) {
  byte s = IX(i, k);
end:
  do
  /* Store::TryAcquireAs: read t_send, then send the request. */
  :: d_step { ph[s] == NONE -> ph[s] = ACQ; aage[s] = 0; aq[s] = 1 }
  /* The acquire reply arrives: the LeaseCore is built, or the grant came too late. */
  :: d_step {
       ph[s] == ACQ && ar[s] != R_NONE ->
       if
       :: ar[s] == R_OK ->
#ifdef ARRIVAL
          su[s] = WIN;
#else
          su[s] = WIN - aage[s];   /* t_send + ttl - drift */
#endif
          tok[s] = artok[s];
          if
          :: su[s] == 0 ->
             /* "granted only after its ttl had passed": worthless, release it */
             rl[s] = tok[s]; tok[s] = REF_NONE; ph[s] = NONE
          :: else -> ph[s] = ACTIVE; st[s] = HELD
          fi
       :: else -> ph[s] = NONE
       fi;
       ar[s] = R_NONE; artok[s] = REF_NONE; aage[s] = 0
     }
  /* Expiry watchdog (Heartbeat::WatchdogLoop -> LeaseCore::CheckExpiry): lost at safe_until,
   * even if no reply ever arrives. */
  :: d_step { ph[s] == ACTIVE && su[s] == 0 -> drop(s) }
  /* Lease::Release: invalid at once (LeaseCore::BeginRelease), then delete if ours. */
  :: d_step { ph[s] == ACTIVE && su[s] > 0 -> drop(s) }
  od
}

/* LeaseCore::OnRenewResult for key k of holder i's round. */
inline on_renew_result(i, k) {
  s = IX(i, k);
  if
  :: ph[s] == ACTIVE && !rgone[s] ->
     was_valid = VALID(s);
     if
#ifndef NO_LATE_GUARD
     :: su[s] == 0 -> drop(s)   /* the guarantee lapsed: never extend a lease past a gap */
#endif
     :: else ->
        if
        :: rres[s] == R_OK ->
#ifdef RENEW_FROM_REPLY
           su[s] = WIN;
#else
           if :: WIN - rage[i] > su[s] -> su[s] = WIN - rage[i] :: else -> skip fi;
#endif
           st[s] = HELD
        :: rres[s] == R_LOST -> drop(s)
        :: rres[s] == R_UNAVAIL -> st[s] = AT_RISK
        fi
     fi;
     /* Property 2: validity that ended never comes back. Only this step raises su, and a
      * lost lease is dropped, so checking here checks every step. */
     assert(was_valid || !VALID(s));
     was_valid = 0
  :: else -> skip
  fi;
  rtok[s] = REF_NONE; rres[s] = R_NONE; rgone[s] = 0
}

/* ---- Renewer(i): the heartbeat's renew round for all of holder i's leases. ---- */
proctype Renewer(byte i) {
  byte k, s, m;
  bit was_valid;
end:
  do
  /* Pick the batch (any non-empty subset of the active leases), read t_send, send. */
  :: atomic {
       rb[i] == RB_IDLE ->
       m = 0; k = 0;
       do
       :: k < NK ->
          if
          :: ph[IX(i, k)] == ACTIVE -> m = m | (1 << k)
          :: ph[IX(i, k)] == ACTIVE && NK > 1 -> skip   /* not due in this round */
          :: else -> skip
          fi;
          k++
       :: else -> break
       od;
       d_step {
         if
         :: m != 0 ->
            k = 0;
            do
            :: k < NK ->
               if :: m & (1 << k) -> rtok[IX(i, k)] = tok[IX(i, k)] :: else -> skip fi;
               k++
            :: else -> break
            od;
            rage[i] = 0; rkeys[i] = m; rmask[i] = m; rb[i] = RB_SENT
         :: else -> skip
         fi;
         m = 0; k = 0; s = 0
       }
     }
  /* RenewMany returned: apply every lease's result with the round's one t_send. */
  :: d_step {
       rb[i] == RB_REPLIED ->
       k = 0;
       do
       :: k < NK ->
          if
          :: rkeys[i] & (1 << k) -> on_renew_result(i, k)
          :: else -> skip
          fi;
          k++
       :: else -> break
       od;
       rb[i] = RB_IDLE; rkeys[i] = 0; rage[i] = 0; k = 0; s = 0
     }
  od
}

/* ---- StoreConn(i, k): the store serving holder i's requests for key k. ---- */
proctype StoreConn(byte i; byte k) {
  byte s = IX(i, k);
  byte gj, gt;
  bit ok;
end:
  do
  /* try-acquire: create the grant only if no live grant exists (expired ones are gone). */
  :: d_step {
       aq[s] ->
       if
       :: sown[k] == 0 -> sown[k] = i + 1; sexp[k] = TTL; ar[s] = R_OK; artok[s] = REF_CUR
       :: else -> ar[s] = R_NO
       fi;
       aq[s] = 0
     }
  /* release: delete only if the owner token still matches. */
  :: d_step {
       rl[s] != REF_NONE ->
       if
#ifdef RELEASE_BY_KEY
       :: sown[k] != 0 -> grant_ends(k)
#else
       :: rl[s] == REF_CUR -> grant_ends(k)
#endif
       :: else -> skip
       fi;
       rl[s] = REF_NONE
     }
  /* renew, this key's part of the batch: extend only if the token matches and it is live. */
  :: atomic {
       rb[i] == RB_SENT && (rmask[i] & (1 << k)) ->
       if
       :: rtok[s] == REF_CUR -> ok = 1
#ifndef NO_TRANSIENT
       :: rtok[s] == REF_CUR -> ok = 0   /* the request was lost: the holder is at risk */
#endif
       :: else -> ok = 0
       fi;
       d_step {
         if
         :: rtok[s] == REF_CUR && ok -> sexp[k] = TTL; rres[s] = R_OK
         :: rtok[s] == REF_CUR && !ok -> rres[s] = R_UNAVAIL
         :: else -> rres[s] = R_LOST
         fi;
         ok = 0;
         rmask[i] = rmask[i] & ~(1 << k);
         if :: rmask[i] == 0 -> rb[i] = RB_REPLIED :: else -> skip fi
       }
     }
  od
}

init {
  byte i, k;
  atomic {
    i = 0;
    do
    :: i < NH ->
       run Renewer(i);
       k = 0;
       do
       :: k < NK ->
#ifdef BATCH_ONE
          /* holder 0 alone holds the keys beyond 0: its rounds batch them with key 0 */
          if :: i == 0 || k == 0 -> run Lease(i, k); run StoreConn(i, k) :: else -> skip fi;
#else
          run Lease(i, k); run StoreConn(i, k);
#endif
          k++
       :: else -> break
       od;
       i++
    :: else -> break
    od;
    i = 0; k = 0
  }
}

/* ---- Property 1: no two holders valid on one key at once, in every state. ---- */
#define BOTH(a, b, k) (VALID(IX(a, k)) && VALID(IX(b, k)))
#if NH == 2
#define OVERLAP(k) BOTH(0, 1, k)
#elif NH == 3
#define OVERLAP(k) (BOTH(0, 1, k) || BOTH(0, 2, k) || BOTH(1, 2, k))
#else
#error "NH must be 2 or 3"
#endif
#if NK == 1
#define ANY_OVERLAP OVERLAP(0)
#elif NK == 2
#define ANY_OVERLAP (OVERLAP(0) || OVERLAP(1))
#else
#error "NK must be 1 or 2"
#endif

ltl safe { [] !ANY_OVERLAP }
