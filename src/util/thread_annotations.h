// File: util/thread_annotations.h (internal)
//
// Clang thread-safety annotations (no-ops under g++). Use them with leasehold::internal::Mutex
// (util/mutex.h): with libstdc++'s std::mutex the analysis silently does nothing.

#pragma once

#if defined(__clang__)
#define LH_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define LH_THREAD_ANNOTATION_(x)
#endif

#define LH_CAPABILITY(x) LH_THREAD_ANNOTATION_(capability(x))
#define LH_SCOPED_CAPABILITY LH_THREAD_ANNOTATION_(scoped_lockable)
#define LH_GUARDED_BY(x) LH_THREAD_ANNOTATION_(guarded_by(x))
#define LH_PT_GUARDED_BY(x) LH_THREAD_ANNOTATION_(pt_guarded_by(x))
#define LH_REQUIRES(...) LH_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define LH_EXCLUDES(...) LH_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define LH_ACQUIRE(...) LH_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define LH_RELEASE(...) LH_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define LH_NO_THREAD_SAFETY_ANALYSIS LH_THREAD_ANNOTATION_(no_thread_safety_analysis)
