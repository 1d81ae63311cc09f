// File: core/slot_record.h
//
// The text form of a key's schedule record, as the store keeps it (Store::SlotRuns and
// SlotClaim read it, SlotClaim::Finish writes it): a header line, then one line per run, at
// most kMaxSlotHistory, newest first. Not installed: the format is the library's own.
//
// Thread safety: pure functions.

#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "leasehold/schedule.h"
#include "leasehold/status.h"

namespace leasehold::internal {

// Returns the record of `runs` (the first kMaxSlotHistory of them).
std::string FormatSlotRecord(const std::vector<SlotRun>& runs);

// Returns the runs of a record; kInternal for text it does not understand.
Result<std::vector<SlotRun>> ParseSlotRecord(std::string_view text);

}  // namespace leasehold::internal
