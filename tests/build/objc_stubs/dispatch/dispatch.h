// Test stub, not Apple's header: only the declarations csrc/mps/encode.mm and ATen/mps/MPSStream.h
// use, so tests/build/test_mps_host.py can syntax-check the Objective-C++ host on Linux.
#pragma once
typedef struct dispatch_queue_s* dispatch_queue_t;
void dispatch_sync(dispatch_queue_t queue, void (^block)(void));
