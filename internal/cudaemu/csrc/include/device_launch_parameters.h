// gorun CUDA emulator (CPU): stub of device_launch_parameters.h. Everything a kernel
// file may use comes from cuda_emu.h, which the build force-includes.
#ifndef GORUN_EMU_DEVICE_LAUNCH_PARAMETERS_H
#define GORUN_EMU_DEVICE_LAUNCH_PARAMETERS_H
#include "cuda_emu.h"
#endif
