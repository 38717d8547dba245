// Test stub, not Apple's header: only the declarations csrc/mps/encode.mm and ATen/mps/MPSStream.h
// use, so tests/build/test_mps_host.py can syntax-check the Objective-C++ host on Linux.
#pragma once
#include <Metal/Metal.h>
@interface MPSCommandBuffer : NSObject
@end
