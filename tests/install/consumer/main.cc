#include <cstdio>

#include <leasehold/leasehold.h>

int main() {
  auto store = leasehold::Store::Open("memory://");
  if (!store.ok()) {
    return 1;
  }
  auto lease = (*store)->TryAcquire("consumer");
  std::printf("leasehold %s: fencing token %llu\n", leasehold::Version(),
              static_cast<unsigned long long>(lease.ok() ? lease->fencing_token() : 0));
  return lease.ok() && lease->Release().ok() ? 0 : 1;
}
