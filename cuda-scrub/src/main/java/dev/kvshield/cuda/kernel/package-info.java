/**
 * The launch contract of the fused page kernels ({@code src/main/cuda}): argument layout, limits
 * checked before a launch, batch staging and the by-value key parameter. Shared by the CUDA
 * backend and the host build of the kernels, so CPU tests exercise the same launch arguments.
 */
package dev.kvshield.cuda.kernel;
