// File: leasehold/leasehold.h
//
// Umbrella header: everything a program needs to take distributed leases.
//
// Example:
//
//   #include "leasehold/leasehold.h"
//
//   auto store = leasehold::Store::Open("sqlite:///tmp/leases.db");
//   auto lease = (*store)->TryAcquire("job:nightly");
//   if (lease.ok()) RunJob(lease->fencing_token(), lease->lost_token());

#pragma once

#include "leasehold/check.h"
#include "leasehold/clock.h"
#include "leasehold/duration.h"
#include "leasehold/election.h"
#include "leasehold/fenced_write.h"
#include "leasehold/fencing.h"
#include "leasehold/lease.h"
#include "leasehold/lease_info.h"
#include "leasehold/logging.h"
#include "leasehold/metrics.h"
#include "leasehold/options.h"
#include "leasehold/schedule.h"
#include "leasehold/status.h"
#include "leasehold/store.h"
#include "leasehold/version.h"
