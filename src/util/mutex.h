// File: util/mutex.h (internal)
//
// Mutex and MutexLock: std::mutex with clang capability annotations, in the manner of
// leveldb's port::Mutex and util/mutexlock.h. CondVar waits on a Mutex and honours a
// std::stop_token.
//
// Thread safety: thread-safe (it is a mutex).

#pragma once

#include <condition_variable>
#include <mutex>
#include <stop_token>

#include "util/thread_annotations.h"

namespace leasehold::internal {

class LH_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  Mutex(Mutex&&) = delete;
  Mutex& operator=(Mutex&&) = delete;
  ~Mutex() = default;

  void Lock() LH_ACQUIRE() { mu_.lock(); }

  void Unlock() LH_RELEASE() { mu_.unlock(); }

  // For CondVar only.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

class LH_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) LH_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }

  ~MutexLock() LH_RELEASE() { mu_->Unlock(); }

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  MutexLock(MutexLock&&) = delete;
  MutexLock& operator=(MutexLock&&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable bound to one Mutex. Waits REQUIRE the mutex held and return with it
// held; `pred` is evaluated with the mutex held. (Clang cannot tie the bound mutex to the
// caller's, so the waits are exempt from the analysis; the callers' own accesses are not.)
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}

  // Waits until pred() holds, `stop` is requested, or the std::chrono::steady_clock time
  // `deadline` passes. Returns pred().
  template <typename TimePoint, typename Pred>
  bool WaitUntil(TimePoint deadline, std::stop_token stop, Pred pred) LH_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu_->native(), std::adopt_lock);
    bool result = cv_.wait_until(lock, std::move(stop), deadline, std::move(pred));
    lock.release();
    return result;
  }

  // Waits until pred() holds or `stop` is requested. Returns pred().
  template <typename Pred>
  bool Wait(std::stop_token stop, Pred pred) LH_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu_->native(), std::adopt_lock);
    bool result = cv_.wait(lock, std::move(stop), std::move(pred));
    lock.release();
    return result;
  }

  void NotifyAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable_any cv_;
};

}  // namespace leasehold::internal
