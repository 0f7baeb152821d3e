/* mlacore: the version of these headers, for compile-time checks.
 *
 * Compare with mlacore_version() at run time to catch a program built against
 * one release and loaded with another. The build refuses to configure when
 * these numbers differ from the project's version, so they cannot drift.
 * The shared library's SONAME (libmlacore.so.MLACORE_ABI_VERSION) changes
 * when the C ABI changes incompatibly.
 */
#ifndef MLACORE_VERSION_H_
#define MLACORE_VERSION_H_

#define MLACORE_VERSION_MAJOR 0
#define MLACORE_VERSION_MINOR 1
#define MLACORE_VERSION_PATCH 0

/* One number, for #if comparisons: MLACORE_VERSION_NUMBER >= 100 means >= 0.1.0. */
#define MLACORE_VERSION_NUMBER (MLACORE_VERSION_MAJOR * 10000 + MLACORE_VERSION_MINOR * 100 + MLACORE_VERSION_PATCH)

/* The SONAME's number: libmlacore.so.0. */
#define MLACORE_ABI_VERSION 0

#endif /* MLACORE_VERSION_H_ */
