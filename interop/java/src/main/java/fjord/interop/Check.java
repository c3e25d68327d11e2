package fjord.interop;

import java.util.Objects;
import java.util.function.Supplier;

/**
 * The checks every scenario makes: each prints {@code check: WHAT ok} when it holds
 * and throws {@link Failed} (which ends the scenario) when it does not, with what was
 * expected and what was seen.
 */
final class Check {
    /** Poll period of {@link #waitFor}. */
    static final long WAIT_POLL_MS = 50;

    /** A failed check: the message says what was expected and what was seen. */
    static final class Failed extends RuntimeException {
        Failed(String message) {
            super(message);
        }

        Failed(String message, Throwable cause) {
            super(message, cause);
        }
    }

    private Check() {}

    static void ok(String what) {
        System.out.println("check: " + what + " ok");
    }

    static void info(String what) {
        System.out.println("info: " + what);
    }

    static void that(boolean condition, String what, Object seen) {
        if (!condition) {
            throw new Failed(what + " (seen: " + seen + ")");
        }
        ok(what);
    }

    static void equal(Object expected, Object actual, String what) {
        if (!Objects.equals(expected, actual)) {
            throw new Failed(what + ": expected " + expected + ", got " + actual);
        }
        ok(what + " = " + actual);
    }

    static Failed fail(String message) {
        return new Failed(message);
    }

    /**
     * Polls {@code probe} every {@link #WAIT_POLL_MS} until it returns non-null and
     * returns that, or fails after {@code timeoutMs} naming {@code what} and the last
     * state {@code lastSeen} reported.
     */
    static <T> T waitFor(String what, long timeoutMs, Supplier<T> probe, Supplier<Object> lastSeen) {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        while (true) {
            T v = probe.get();
            if (v != null) {
                ok(what);
                return v;
            }
            if (System.nanoTime() > deadline) {
                throw new Failed("timed out after " + timeoutMs + " ms waiting for " + what
                        + " (last seen: " + lastSeen.get() + ")");
            }
            sleep(WAIT_POLL_MS);
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Failed("interrupted");
        }
    }

    /** An exception and its causes, class names and messages, on one line. */
    static String describe(Throwable e) {
        StringBuilder sb = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause() == t ? null : t.getCause()) {
            if (sb.length() > 0) {
                sb.append(" <- caused by ");
            }
            sb.append(t.getClass().getName()).append(": ").append(t.getMessage());
        }
        return sb.toString();
    }
}
