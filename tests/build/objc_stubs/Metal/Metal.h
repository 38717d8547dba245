// Test stub, not Apple's header: only the declarations csrc/mps/encode.mm and ATen/mps/MPSStream.h
// use, so tests/build/test_mps_host.py can syntax-check the Objective-C++ host on Linux.
#pragma once
#include <Foundation/Foundation.h>
#include <dispatch/dispatch.h>
typedef struct { NSUInteger width, height, depth; } MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger w, NSUInteger h, NSUInteger d) { MTLSize s = {w, h, d}; return s; }
typedef enum { MTLLanguageVersion3_1 = 196609 } MTLLanguageVersion;
typedef enum { MTLMathModeSafe = 0 } MTLMathMode;
typedef enum { MTLMathFloatingPointFunctionsPrecise = 1 } MTLMathFloatingPointFunctions;
@protocol MTLBuffer
@end
@protocol MTLFunction
@end
@protocol MTLSharedEvent
@end
@protocol MTLCommandQueue
@end
@protocol MTLComputePipelineState
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end
@protocol MTLLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString*)name;
@end
@interface MTLCompileOptions : NSObject
@property MTLLanguageVersion languageVersion;
@property BOOL fastMathEnabled;
@property MTLMathMode mathMode;
@property MTLMathFloatingPointFunctions mathFloatingPointFunctions;
@end
@protocol MTLDevice
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)fn error:(NSError**)error;
@end
@protocol MTLComputeCommandEncoder
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads;
@end
typedef void (^MTLCommandBufferHandler)(void);
