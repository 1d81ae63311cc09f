/* File: tests/model/lease.pml
 *
 * A Promela model of leasehold's safety rule (DESIGN.md section 3), checked by spin:
 *
 *   safe_until = t_send + ttl - drift      (t_send read BEFORE the request is sent)
 *
 * Property, on the true time base (the `now` below, which no process reads):
 *   1. for every key, no two holders' [acquired, safe_until) validity windows overlap;
 *   2. a lease whose validity ended (lost, released, or its clock reached safe_until) is never
 *      valid again.
 * Both are one LTL claim (`safe`, at the end), evaluated in every reachable state.
 *
 * Which code each part stands for:
 *   Time()            the true time base, and one clock per process: the holders' Clock
 *                     (include/leasehold/clock.h, CLOCK_BOOTTIME in production) and the store's
 *                     own clock (Redis/SQL server time, MemoryTable's clock_ in
 *                     src/backends/memory/).
 *   Lease(i,k)        holder i's use of key k: Store::TryAcquireAs (src/core/store.cc: t_send
 *                     read before backend.TryAcquire, the "granted only after its ttl" check),
 *                     the LeaseCore constructor (src/core/lease_core.cc: safe_until_ =
 *                     t_send + ttl - drift), Lease::Release / LeaseCore::BeginRelease, and the
 *                     expiry watchdog (Heartbeat::WatchdogLoop -> LeaseCore::CheckExpiry).
 *   Renewer(i)        holder i's heartbeat renew round (Heartbeat::RenewLoop in
 *                     src/heartbeat/heartbeat.cc): ONE t_send read before ONE RenewMany batch
 *                     of several leases, then LeaseCore::OnRenewResult(t_send, result) per
 *                     lease.
 *   StoreConn(i,k)    the store serving holder i's requests for key k, each one atomic as the
 *                     backends make it (Lua script, SQL statement; MemoryTable::TryAcquire,
 *                     ::Renew, ::Release): grant only if no live grant exists, renew and delete
 *                     only if the owner token matches, expiry by the store's own clock.
 *
 * State names are the code's (LeaseState in include/leasehold/lease_info.h): HELD, AT_RISK,
 * LOST. A lease is valid (Lease::valid(), LeaseCore::Valid) while it is not lost, not released
 * and its holder's clock reads < safe_until.
 *
 * Clocks. A clock reads now + e, with e in [0, EPS]. At every tick each e may take any value
 * in that range that keeps the clock monotonic (it advances by 0 .. EPS+1 per tick). So over
 * any interval a clock's measured length is within EPS of the true length, and two clocks
 * disagree about any interval by at most 2*EPS: that is the rate drift (plus read granularity)
 * that the code's drift allowance (LeaseOptions::DefaultDrift: ttl/100 + 2 ms) must cover.
 * The model sets DRIFT = 2*EPS, the exact bound: the control DRIFT=2*EPS-1 fails.
 *
 * Pauses and delays. Every action is an atomic step of one process; nothing forces any process
 * to run (no fairness) while Time ticks on, so any process can stop for any number of ticks
 * between any two of its steps, and any request or reply can be delayed for any number of
 * ticks (it waits in its slot until the receiver runs). Requests can be lost (the store answers
 * UNAVAIL without applying it) and replies can be lost (applied, answered UNAVAIL).
 *
 * Over-approximations (each only adds behaviours, so a proof here covers the code):
 *   - the renewer may start a round at any moment, with any non-empty subset of the holder's
 *     active leases (the code renews at last t_send + renew_interval, batching those due within
 *     BatchSlack; retries after failures are earlier still);
 *   - any process may pause anywhere; the store may process a batch's keys at different store
 *     times (a pipeline).
 *
 * Bounds (the search is exhaustive within them): true time 0..TMAX ticks, TTL ticks per grant,
 * at most MAXF grants of each key per run (then the store answers UNAVAIL), NH holders, NK keys
 * per holder. Defaults below; the runner (run.sh) passes the configurations it checks.
 *
 * Negative controls (each must produce a counterexample):
 *   -DARRIVAL           an acquire's safe_until counts from the reply's arrival, not t_send;
 *   -DNODRIFT           drift allowance 0 while the clocks still drift;
 *   -DRENEW_FROM_REPLY  a renewal extends safe_until from the reply's arrival;
 *   -DNO_LATE_GUARD     OnRenewResult applies a success even at or after safe_until;
 *   -DDRIFT=n           any allowance below 2*EPS.
 */

#ifndef NH
#define NH 2            /* holders (processes), each with its own clock */
#endif
#ifndef NK
#define NK 2            /* keys; every holder has one lease slot per key */
#endif
#ifndef EPS
#define EPS 1           /* per-clock error bound, ticks */
#endif
#ifndef TTL
#define TTL 4           /* the grant's TTL, ticks */
#endif
#ifndef NODRIFT
#ifndef DRIFT
#define DRIFT (2 * EPS) /* the code's drift allowance */
#endif
#else
#define DRIFT 0
#endif
#ifndef TMAX
#define TMAX 9          /* the last tick of true time */
#endif
#ifndef MAXF
#define MAXF 3          /* grants per key per run */
#endif

#define NS (NH * NK)            /* lease slots */
#define IX(i, k) ((i) * NK + (k))
#define STORE NH                /* the store's clock index */
#define CLK(c) (now + e[c])     /* what clock c reads */

/* Lease slot phases (not code states: where the slot's Lease object is in its life). */
#define NONE 0      /* no Lease object (never acquired, or released / lost and dropped) */
#define ACQ 1       /* Store::TryAcquire in flight */
#define ACTIVE 2    /* a Lease object exists (HELD, AT_RISK or LOST) */

/* LeaseState */
#define HELD 0
#define AT_RISK 1
#define LOST 2

/* Replies */
#define R_NONE 0
#define R_OK 1          /* granted / renewed */
#define R_HELD 2        /* kHeldByAnother */
#define R_LOST 3        /* kLost: token mismatch or expired */
#define R_UNAVAIL 4     /* kUnavailable: request or reply lost, timeout */

/* Renew round phases */
#define RB_IDLE 0
#define RB_SENT 1       /* RenewMany in flight: the store works through rmask */
#define RB_REPLIED 2    /* RenewMany returned */

byte now;               /* true time: the monitor's base, read by no process */
byte e[NH + 1];         /* clock errors: holders 0..NH-1, the store NH */

/* Holder side, per slot (LeaseCore) */
byte ph[NS];
byte st[NS];            /* LeaseCore::state_ */
byte su[NS];            /* LeaseCore::safe_until_, on the holder's clock */
byte tok[NS];           /* this Lease's owner token (the grant's number: unique per key) */
bit gone[NS];           /* ghost: this Lease's validity has ended */
byte ats[NS];           /* t_send of the acquire in flight */

/* Acquire and release messages, per slot */
bit aq[NS];             /* acquire request in flight */
byte ar[NS];            /* acquire reply */
byte artok[NS];         /* the token the reply grants */
byte rl[NS];            /* release request in flight: its token, 0 = none */

/* Renew round, per holder (Heartbeat::RenewLoop's batch) */
byte rb[NH];
byte rts[NH];           /* the round's t_send */
byte rkeys[NH];         /* bit k: key k is in the batch */
byte rmask[NH];         /* bit k: key k not yet processed by the store */
byte rtok[NS];          /* the token sent for each key (RenewRequest::owner_token) */
byte rres[NS];          /* the store's result for each key */

/* Store, per key */
byte sown[NK];          /* holder + 1 of the live grant, 0 = none */
byte stok[NK];          /* its owner token */
byte sexp[NK];          /* its expiry, on the store's clock */
byte sfence[NK];        /* fencing counter = the last token handed out */

#define VALID(s) (ph[s] == ACTIVE && st[s] != LOST && CLK((s) / NK) < su[s])

/* ---- Time: the true clock ticks; every clock advances by a bounded-error amount. ---- */
inline advance_clock(c) {
  /* new error in [max(0, e-1), EPS]: the clock never runs backwards */
  if
  :: e[c] > 0 -> e[c] = e[c] - 1
  :: else -> skip
  fi;
  do
  :: e[c] < EPS -> e[c]++
  :: break
  od
}

active proctype Time() {
  byte c, s, k;
  do
  :: atomic {
       now < TMAX ->
       now++;
       c = 0;
       do
       :: c <= NH -> advance_clock(c); c++
       :: else -> break
       od;
       c = 0;
       /* Ghost: a Lease whose clock reached safe_until has ended, lost or not yet marked. */
       s = 0;
       do
       :: s < NS ->
          if
          :: ph[s] == ACTIVE && CLK(s / NK) >= su[s] -> gone[s] = 1
          :: else -> skip
          fi;
          s++
       :: else -> break
       od;
       s = 0;
       /* An expired grant is as good as none (every check below tests expiry first): forget
        * it, so that dead grants do not multiply the states. */
       k = 0;
       do
       :: k < NK ->
          if
          :: sown[k] != 0 && CLK(STORE) >= sexp[k] -> sown[k] = 0; stok[k] = 0; sexp[k] = 0
          :: else -> skip
          fi;
          k++
       :: else -> break
       od;
       k = 0
     }
  :: now >= TMAX -> break
  od
}

/* ---- Lease(i, k): acquire, release, the watchdog. ---- */
proctype Lease(byte i; byte k) {
  byte s = IX(i, k);
end:
  do
  /* Store::TryAcquireAs: read t_send, then send the request. */
  :: atomic {
       ph[s] == NONE && ar[s] == R_NONE ->
       ph[s] = ACQ; ats[s] = CLK(i); aq[s] = 1
     }
  /* The acquire reply arrives. */
  :: atomic {
       ph[s] == ACQ && ar[s] != R_NONE ->
       if
       :: ar[s] == R_OK ->
#ifdef ARRIVAL
          su[s] = CLK(i) + TTL - DRIFT;
#else
          su[s] = ats[s] + TTL - DRIFT;
#endif
          if
          :: CLK(i) >= su[s] ->
             /* "granted only after its ttl had passed": worthless, release it */
             rl[s] = artok[s]; ph[s] = NONE; su[s] = 0
          :: else ->
             ph[s] = ACTIVE; st[s] = HELD; tok[s] = artok[s]; gone[s] = 0
          fi
       :: else -> ph[s] = NONE
       fi;
       ar[s] = R_NONE; artok[s] = 0; ats[s] = 0
     }
  /* Expiry watchdog (LeaseCore::CheckExpiry): lost at safe_until, even with no reply. */
  :: atomic {
       ph[s] == ACTIVE && st[s] != LOST && CLK(i) >= su[s] ->
       st[s] = LOST; gone[s] = 1
     }
  /* Lease::Release (or dropping a lost lease): invalid at once, then delete if ours. */
  :: atomic {
       ph[s] == ACTIVE ->
       rl[s] = tok[s]; gone[s] = 0; ph[s] = NONE; st[s] = HELD; su[s] = 0; tok[s] = 0
     }
  od
}

/* LeaseCore::OnRenewResult for key k of holder i's round. */
inline on_renew_result(i, k) {
  s = IX(i, k);
  /* The round's result belongs to the Lease object it was sent for; a newer object in the
   * same slot (after release and re-acquire) was not in that batch. */
  if
  :: ph[s] == ACTIVE && tok[s] == rtok[s] && st[s] != LOST ->
     if
#ifndef NO_LATE_GUARD
     :: CLK(i) >= su[s] ->
        st[s] = LOST; gone[s] = 1   /* the guarantee lapsed: never extend past a gap */
#endif
     :: else ->
        if
        :: rres[s] == R_OK ->
#ifdef RENEW_FROM_REPLY
           if
           :: CLK(i) + TTL - DRIFT > su[s] -> su[s] = CLK(i) + TTL - DRIFT
           :: else -> skip
           fi;
#else
           if
           :: rts[i] + TTL - DRIFT > su[s] -> su[s] = rts[i] + TTL - DRIFT
           :: else -> skip
           fi;
#endif
           st[s] = HELD
        :: rres[s] == R_LOST -> st[s] = LOST; gone[s] = 1
        :: rres[s] == R_UNAVAIL -> st[s] = AT_RISK
        fi
     fi
  :: else -> skip
  fi;
  rtok[s] = 0; rres[s] = R_NONE
}

/* ---- Renewer(i): the heartbeat's renew round for all of holder i's leases. ---- */
proctype Renewer(byte i) {
  byte k, s, m;
end:
  do
  /* Pick the batch (any non-empty subset of the active leases), read t_send, send. */
  :: atomic {
       rb[i] == RB_IDLE ->
       m = 0; k = 0;
       do
       :: k < NK ->
          s = IX(i, k);
          if
          :: ph[s] == ACTIVE && st[s] != LOST -> m = m | (1 << k); rtok[s] = tok[s]
          :: ph[s] == ACTIVE && st[s] != LOST -> skip   /* not due in this round */
          :: else -> skip
          fi;
          k++
       :: else -> break
       od;
       if
       :: m != 0 -> rts[i] = CLK(i); rkeys[i] = m; rmask[i] = m; rb[i] = RB_SENT
       :: else -> skip
       fi;
       m = 0; k = 0; s = 0
     }
  /* RenewMany returned: apply every lease's result with the round's one t_send. */
  :: atomic {
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
       rb[i] = RB_IDLE; rkeys[i] = 0; rts[i] = 0; k = 0; s = 0
     }
  od
}

/* ---- StoreConn(i, k): the store, serving holder i's requests for key k. ---- */
#define LIVE(k) (sown[k] != 0 && CLK(STORE) < sexp[k])

proctype StoreConn(byte i; byte k) {
  byte s = IX(i, k);
end:
  do
  /* try-acquire: create the grant only if no live grant exists. */
  :: atomic {
       aq[s] ->
       if
       :: !LIVE(k) && sfence[k] < MAXF ->
          sfence[k]++;
          sown[k] = i + 1; stok[k] = sfence[k]; sexp[k] = CLK(STORE) + TTL;
          if
          :: ar[s] = R_OK; artok[s] = stok[k]
          :: ar[s] = R_UNAVAIL           /* granted, reply lost: the grant just expires */
          fi
       :: !LIVE(k) && sfence[k] >= MAXF -> ar[s] = R_UNAVAIL   /* the model's grant bound */
       :: LIVE(k) -> ar[s] = R_HELD
       :: ar[s] = R_UNAVAIL                                    /* request lost */
       fi;
       aq[s] = 0
     }
  /* release: delete only if the owner token still matches. */
  :: atomic {
       rl[s] != 0 ->
       if
       :: sown[k] == i + 1 && stok[k] == rl[s] -> sown[k] = 0; stok[k] = 0; sexp[k] = 0
       :: else -> skip
       fi;
       rl[s] = 0
     }
  /* renew, this key's part of the batch: extend only if the token matches and it is live. */
  :: atomic {
       rb[i] == RB_SENT && (rmask[i] & (1 << k)) ->
       if
       :: LIVE(k) && sown[k] == i + 1 && stok[k] == rtok[s] ->
          if
          :: sexp[k] = CLK(STORE) + TTL; rres[s] = R_OK
          :: sexp[k] = CLK(STORE) + TTL; rres[s] = R_UNAVAIL   /* renewed, reply lost */
          :: rres[s] = R_UNAVAIL                               /* request lost */
          fi
       :: else ->
          if
          :: rres[s] = R_LOST
          :: rres[s] = R_UNAVAIL
          fi
       fi;
       rmask[i] = rmask[i] & ~(1 << k);
       if
       :: rmask[i] == 0 -> rb[i] = RB_REPLIED
       :: else -> skip
       fi
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
       :: k < NK -> run Lease(i, k); run StoreConn(i, k); k++
       :: else -> break
       od;
       i++
    :: else -> break
    od;
    i = 0; k = 0
  }
}

/* ---- The property ---- */
/* Two holders a, b both valid on key k at once. */
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
/* A Lease valid again after its validity ended. */
#define REVIVED(s) (VALID(s) && gone[s])
#if NS == 2
#define ANY_REVIVED (REVIVED(0) || REVIVED(1))
#elif NS == 3
#define ANY_REVIVED (REVIVED(0) || REVIVED(1) || REVIVED(2))
#elif NS == 4
#define ANY_REVIVED (REVIVED(0) || REVIVED(1) || REVIVED(2) || REVIVED(3))
#elif NS == 6
#define ANY_REVIVED (REVIVED(0) || REVIVED(1) || REVIVED(2) || REVIVED(3) || REVIVED(4) || \
                     REVIVED(5))
#else
#error "unsupported NH * NK"
#endif

ltl safe { [] !(ANY_OVERLAP || ANY_REVIVED) }
