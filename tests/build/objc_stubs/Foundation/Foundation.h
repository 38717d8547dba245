// Test stub, not Apple's header: only the declarations csrc/mps/encode.mm and ATen/mps/MPSStream.h
// use, so tests/build/test_mps_host.py can syntax-check the Objective-C++ host on Linux.
#pragma once
typedef unsigned long NSUInteger;
typedef signed char BOOL;
#define nil nullptr
#define YES ((BOOL)1)
#define NO ((BOOL)0)
@interface NSObject
+ (instancetype)new;
@end
@interface NSString : NSObject
+ (instancetype)stringWithUTF8String:(const char*)s;
@property(readonly) const char* UTF8String;
@end
@interface NSError : NSObject
@property(readonly) NSString* localizedDescription;
@end
@interface NSDictionary : NSObject
@end
