// SAGE_HOST_DEVICE: functions written as plain C++ so the host can run them too (the unit tests
// compile them with g++), inlined into device code under nvcc.
#pragma once

#if defined(__CUDACC__)
#define SAGE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAGE_HOST_DEVICE inline
#endif
