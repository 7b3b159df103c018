package dev.kvshield.cuda;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import org.junit.jupiter.api.extension.ConditionEvaluationResult;
import org.junit.jupiter.api.extension.ExecutionCondition;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * The one class-level condition of the GPU tests: {@link CudaProbe} runs once per JVM when the
 * first annotated class is evaluated (never in a static initialiser) and, without a usable GPU,
 * every annotated class is skipped with the probe's reason.
 */
@Target(ElementType.TYPE)
@Retention(RetentionPolicy.RUNTIME)
@ExtendWith(RequiresGpu.Condition.class)
@interface RequiresGpu {
    /** Skips with the probe's reason when no GPU is usable. */
    final class Condition implements ExecutionCondition {
        @Override
        public ConditionEvaluationResult evaluateExecutionCondition(ExtensionContext context) {
            CudaProbe.Result probe = CudaProbe.probe();
            return probe.available() ? ConditionEvaluationResult.enabled("GPU present: " + probe.reason())
                    : ConditionEvaluationResult.disabled("no GPU: " + probe.reason());
        }
    }
}
