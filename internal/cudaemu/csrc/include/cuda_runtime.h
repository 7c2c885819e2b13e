// gorun CUDA emulator (CPU): stub of cuda_runtime.h. Everything a kernel
// file may use comes from cuda_emu.h, which the build force-includes.
#ifndef GORUN_EMU_CUDA_RUNTIME_H
#define GORUN_EMU_CUDA_RUNTIME_H
#include "cuda_emu.h"
#endif
