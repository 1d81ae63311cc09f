// File: backends/zookeeper/zk_layout.h (internal)
//
// The zk:// store's layout in the ZooKeeper tree (see zk_backend.h): node names and the bytes
// each kind of node holds, written and parsed in one place. Plain functions of strings: no
// client call, no zookeeper.h.
//
//   <chroot>/leasehold/<escaped key>/<id><tag>-<sequence>
//                                    a grant or queued waiter (ephemeral): "<ttl ms>[ <slot>]\n
//                                    <token prefix>\n<holder>"; <tag> is the kind (KindTag):
//                                    "" exclusive, ".s" shared, ".n<N>" a semaphore of N; the
//                                    slot is written when a shared or semaphore grant is made
//   <chroot>/leasehold/<escaped key>/kept[<tag>.<slot>]
//                                    a grant kept after its holder ("kept" for an exclusive one):
//                                    "kept1\n<keep ms>\n<fencing token>\n<token prefix>\n
//                                    <holder>"
//   <chroot>/leasehold/<escaped key>/record            the record: "<ttl ms>\n<bytes>"
//
// Example:
//
//   const std::string dir = base + "/" + zk_layout::EscapeKey("jobs/nightly");
//   zk_layout::SortBySequence(children);  // children.front() holds the key
//
// Thread safety: plain functions.

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "leasehold/clock.h"
#include "leasehold/lease_info.h"

namespace leasehold::internal::zk_layout {

// The node every key node lives under, below the chroot.
inline constexpr std::string_view kRootName = "leasehold";
// The node whose mtime is the leader's clock (ZkBackend::LeaderNow), below the chroot.
inline constexpr std::string_view kClockName = "leasehold-clock";
// Children of a key's node besides the queued ones (no '-': never taken for a queued node).
inline constexpr std::string_view kKeptName = "kept";
inline constexpr std::string_view kRecordName = "record";

// Node names: [A-Za-z0-9_-] stay, every other byte becomes %XX, so any key (with '/', '.',
// control characters or bytes ZooKeeper refuses) is one valid node name.
std::string EscapeKey(std::string_view key);
// The key of a node name; nullopt if it is not an escaped key (EscapeKey's output exactly: no
// other byte unescaped, upper-case hex, no escape of a byte EscapeKey keeps).
std::optional<std::string> UnescapeKey(std::string_view name);

// The keys among the key nodes `names` that start with `prefix`, in key order.
std::vector<std::string> KeysWithPrefix(const std::vector<std::string>& names,
                                        std::string_view prefix);

// The sequence number ZooKeeper appended: the 10 digits after the last '-'; -1 if none.
std::int64_t SequenceOf(std::string_view name);

// Orders children by sequence (never by whole name: the prefixes are random). Nodes that are
// not ours (no sequence) are dropped: never taken for a holder.
void SortBySequence(std::vector<std::string>& children);

// How a queued node's grant shares its key (LeaseInfo::mode and ::limit), from its name.
struct NodeKind {
  LeaseMode mode = LeaseMode::kExclusive;
  std::uint32_t limit = 1;
  friend bool operator==(const NodeKind&, const NodeKind&) = default;
};

// The tag a node name carries for `kind`, between the id and the '-' before the sequence: ""
// for an exclusive grant (the layout of every earlier version, so that an older client and this
// one see each other's exclusive grants), ".s" for a shared one, ".n<N>" for a semaphore of N.
std::string KindTag(NodeKind kind);
// The kind of a queued node "<id><tag>-<sequence>". A name without a tag (an exclusive grant,
// or one of an older client) or with a tag this version does not know is exclusive: it keeps
// every other grant out, never lets one in.
NodeKind KindOfNode(std::string_view name);

// The name of the node that keeps a grant of `kind` in `slot` after its holder: "kept" for an
// exclusive grant (as earlier versions name it), "kept<tag>.<slot>" otherwise (one per slot:
// a live kept grant holds its slot, so the grant that finishes in a slot only ever meets an
// expired one there, which it replaces).
std::string KeptName(NodeKind kind, std::uint32_t slot);

// A kept node's kind and slot, from its name; nullopt if `name` is not one.
struct KeptSlot {
  NodeKind kind;
  std::uint32_t slot = 0;
};

std::optional<KeptSlot> ParseKeptName(std::string_view name);

// A grant's or waiter's node data, with the grant's slot once it is known (a shared or
// semaphore grant's, written when it is made). The slot goes after the TTL on the first line:
// an older client reads the TTL there with from_chars, which stops at the space.
std::string NodeData(Duration ttl, std::string_view owner_token, std::string_view holder,
                     std::optional<std::uint32_t> slot = std::nullopt);
// Reads a grant's node data; `czxid` (the node's) is the fencing token, and remaining = ttl (the
// server cannot say more). The slot is 0 if the data has none.
LeaseInfo ParseNodeData(std::string_view key, std::string_view data, FencingToken czxid);
// The slot written in a node's data; nullopt if none (an exclusive grant, a queued waiter, or a
// shared or semaphore grant not yet made).
std::optional<std::uint32_t> SlotOfNodeData(std::string_view data);
// ParseNodeData, with the kind of the node's name, and the slot of its data.
LeaseInfo ParseNode(std::string_view key, std::string_view name, std::string_view data,
                    FencingToken czxid);

// The kept grant's node data. It is live until its mtime (the leader's time of the Finish) plus
// keep.
std::string KeptData(Duration keep, FencingToken fencing, std::string_view owner_token,
                     std::string_view holder);
// Parses a kept node; nullopt if it is not in our layout. `info.ttl` is the keep.
std::optional<LeaseInfo> ParseKeptData(std::string_view key, std::string_view data);

// The record's node data, live until its mtime plus the TTL.
std::string RecordData(Duration ttl, std::string_view record);

// A record node's data as RecordData wrote it: the TTL, and the record (a view into `data`).
struct RecordNode {
  Duration ttl{};
  std::string_view record;
};

// Reads a record node's data; nullopt if it is not in our layout.
std::optional<RecordNode> ParseRecordData(std::string_view data);

// Splits off the text up to the next '\n' as a number; false if there is none.
bool TakeNumber(std::string_view& text, std::int64_t* value);

// A node's mtime or ctime (milliseconds since the epoch, on the server's clock).
SystemTime FromZkMillis(std::int64_t ms);

// Why the store does not write the data node `path` (a FencedWrite key: a node path in the URL's
// chroot, which is `chroot`, "" for none), or "" if it does. Refused: a path that is not
// absolute, "/" itself (the chroot's own node), a trailing '/', an empty, "." or ".." component,
// what ZooKeeper refuses in a path (NUL, control characters, U+0080..U+009F, U+D800..U+F8FF,
// U+FFF0 and above, which includes every character outside the BMP, and bytes that are not
// UTF-8), leasehold's own nodes (/leasehold, /leasehold-clock and below) and, without a chroot,
// ZooKeeper's own (/zookeeper and below).
std::string DataPathProblem(std::string_view chroot, std::string_view path);

}  // namespace leasehold::internal::zk_layout
