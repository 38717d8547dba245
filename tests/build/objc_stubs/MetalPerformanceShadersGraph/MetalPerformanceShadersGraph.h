// Test stub, not Apple's header: only the declarations csrc/mps/encode.mm and ATen/mps/MPSStream.h
// use, so tests/build/test_mps_host.py can syntax-check the Objective-C++ host on Linux.
#pragma once
@interface MPSGraph : NSObject
@end
@interface MPSGraphExecutionDescriptor : NSObject
@end
@interface MPSGraphCompilationDescriptor : NSObject
@end
