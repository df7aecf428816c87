// Java kernel of the cellfork code interpreter: one JVM per code context,
// started (java kernel.java, source-file mode) and driven by the Go package
// internal/agent/codeinterp; the protocol is described in foreign.go there.
// Cells are evaluated by JShell in this JVM, one snippet at a time, as IJava
// (E2B's Java kernel) does: what a snippet writes to System.out/err is sent
// as it is written, the value of a last expression as the main result, a
// compilation error as `CompilationException`, an exception by its class
// name. The sandbox's and an execution's environment variables are also
// system properties (System.getProperty), as in E2B.

import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public class kernel {
    static OutputStream events;
    static final Object eventLock = new Object();

    static void send(String json) {
        byte[] b = (json + "\n").getBytes(StandardCharsets.UTF_8);
        synchronized (eventLock) {
            try {
                events.write(b);
                events.flush();
            } catch (IOException e) {
                Runtime.getRuntime().halt(0); // the agent is gone
            }
        }
    }

    static String str(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static String error(String name, String value, String traceback) {
        return "{\"type\":\"error\",\"name\":" + str(name) + ",\"value\":" + str(value)
                + ",\"traceback\":" + str(traceback) + "}";
    }

    /** EventStream turns every write to System.out or System.err into an event. */
    static class EventStream extends OutputStream {
        final String name;
        final CharsetDecoder decoder = StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPLACE)
                .onUnmappableCharacter(CodingErrorAction.REPLACE);
        ByteBuffer pending = ByteBuffer.allocate(0);

        EventStream(String name) { this.name = name; }

        @Override public void write(int b) { write(new byte[] {(byte) b}, 0, 1); }

        @Override public synchronized void write(byte[] b, int off, int len) {
            ByteBuffer in = ByteBuffer.allocate(pending.remaining() + len);
            in.put(pending).put(b, off, len).flip();
            CharBuffer out = CharBuffer.allocate(in.remaining() + 1);
            decoder.decode(in, out, false); // an incomplete character waits
            pending = in.slice();
            out.flip();
            if (out.hasRemaining()) {
                send("{\"type\":\"" + name + "\",\"text\":" + str(out.toString())
                        + ",\"timestamp\":\"" + Instant.now() + "\"}");
            }
        }
    }

    static InputStream commands;

    static String line() throws IOException {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        for (int c = commands.read(); c != '\n'; c = commands.read()) {
            if (c < 0) Runtime.getRuntime().halt(0);
            b.write(c);
        }
        return b.toString(StandardCharsets.UTF_8);
    }

    static String field() throws IOException {
        int n = Integer.parseInt(line().trim());
        byte[] b = commands.readNBytes(n);
        if (b.length < n) Runtime.getRuntime().halt(0);
        return new String(b, StandardCharsets.UTF_8);
    }

    static volatile boolean running, interrupted;

    public static void main(String[] args) throws Exception {
        String mark = System.getenv().getOrDefault("CELLFORK_MARK", "");
        commands = new java.io.BufferedInputStream(new FileInputStream("/proc/self/fd/3"));
        events = new FileOutputStream("/proc/self/fd/4");
        PrintStream realOut = new PrintStream(new FileOutputStream(java.io.FileDescriptor.out), true);
        PrintStream realErr = new PrintStream(new FileOutputStream(java.io.FileDescriptor.err), true);
        // A PrintStream subclass writes a println's text and its newline
        // separately, as IJava's stream does.
        System.setOut(new PrintStream(new EventStream("stdout"), true, StandardCharsets.UTF_8) {});
        System.setErr(new PrintStream(new EventStream("stderr"), true, StandardCharsets.UTF_8) {});

        JShell shell = JShell.builder().executionEngine("local").build();
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        // The jshell tool's default imports.
        for (String p : new String[] {"java.io", "java.math", "java.net", "java.nio.file", "java.util",
                "java.util.concurrent", "java.util.function", "java.util.prefs", "java.util.regex", "java.util.stream"}) {
            shell.eval("import " + p + ".*;");
        }
        shell.eval("1"); // the compiler's first use is slow: not in a cell
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> {
            if (running) {
                interrupted = true;
                shell.stop();
            }
        });

        Map<String, String> global = new HashMap<>();
        int count = 0;
        send("{\"type\":\"ready\",\"pid\":" + ProcessHandle.current().pid() + "}");
        while (true) {
            String[] head = line().trim().split(" ");
            long id = Long.parseLong(head[0]);
            int nenv = Integer.parseInt(head[1]), ntmp = Integer.parseInt(head[2]);
            String code = field();
            Map<String, String> env = new LinkedHashMap<>(), tmp = new LinkedHashMap<>();
            for (int i = 0; i < nenv; i++) env.put(field(), field());
            for (int i = 0; i < ntmp; i++) tmp.put(field(), field());
            env.forEach(System::setProperty);
            global.putAll(env);
            Map<String, String> saved = new HashMap<>();
            tmp.forEach((k, v) -> saved.put(k, System.getProperty(k)));
            tmp.forEach(System::setProperty);
            count++;
            send("{\"type\":\"number_of_executions\",\"execution_count\":" + count + "}");
            try {
                interrupted = false;
                running = true;
                run(shell, analysis, code);
            } catch (Throwable t) {
                send(error(t.getClass().getName(), String.valueOf(t.getMessage()), ""));
            } finally {
                running = false;
            }
            // An execution's own variables go back to the sandbox's value, or away.
            for (String k : tmp.keySet()) {
                String v = global.containsKey(k) ? global.get(k) : saved.get(k);
                if (v == null) System.clearProperty(k);
                else System.setProperty(k, v);
            }
            System.out.flush();
            System.err.flush();
            realOut.print(mark);
            realOut.flush();
            realErr.print(mark);
            realErr.flush();
            send("{\"type\":\"done\",\"id\":" + id + "}");
        }
    }

    /** run evaluates a cell snippet by snippet and reports its last value. */
    static void run(JShell shell, SourceCodeAnalysis analysis, String code) {
        String rest = code;
        String value = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
            String source;
            switch (info.completeness()) {
                case COMPLETE:
                case COMPLETE_WITH_SEMI:
                    source = info.source();
                    rest = info.remaining();
                    break;
                case EMPTY:
                    return;
                default: // incomplete or unknown: let the compiler say why
                    source = rest;
                    rest = "";
            }
            value = null;
            List<SnippetEvent> evs = shell.eval(source);
            if (interrupted) {
                send(error("KeyboardInterrupt", "interrupted", ""));
                return;
            }
            for (SnippetEvent ev : evs) {
                if (ev.causeSnippet() != null) continue;
                Snippet sn = ev.snippet();
                if (ev.status() == Snippet.Status.REJECTED) {
                    String diags = shell.diagnostics(sn).map(d -> describe(d, sn.source()))
                            .collect(Collectors.joining("\n"));
                    send(error("CompilationException", diags, diags));
                    return;
                }
                JShellException ex = ev.exception();
                if (ex != null) {
                    send(exception(ex));
                    return;
                }
                boolean expression = sn.kind() == Snippet.Kind.EXPRESSION
                        || (sn instanceof VarSnippet && sn.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND);
                if (expression && ev.value() != null) value = ev.value();
            }
        }
        if (value != null) {
            String text = value;
            if (text.length() >= 2 && text.startsWith("\"") && text.endsWith("\"")) {
                text = text.substring(1, text.length() - 1); // as upstream
            }
            send("{\"type\":\"result\",\"text\":" + str(text) + ",\"is_main_result\":true}");
        }
    }

    static String describe(Diag d, String source) {
        long pos = d.getStartPosition();
        String where = "";
        if (pos >= 0 && pos <= source.length()) {
            int line = 1;
            for (int i = 0; i < pos; i++) if (source.charAt(i) == '\n') line++;
            where = "line " + line + ": ";
        }
        return where + d.getMessage(null);
    }

    static String exception(JShellException ex) {
        String name, message = ex.getMessage();
        if (ex instanceof EvalException) {
            name = ((EvalException) ex).getExceptionClassName();
        } else if (ex instanceof UnresolvedReferenceException) {
            name = "UnresolvedReferenceException";
            message = "unresolved reference: " + ((UnresolvedReferenceException) ex).getSnippet().source().trim();
        } else {
            name = ex.getClass().getName();
        }
        StringBuilder tb = new StringBuilder(name);
        if (message != null) tb.append(": ").append(message);
        for (StackTraceElement e : ex.getStackTrace()) tb.append("\n\tat ").append(e);
        return error(name, message == null ? "" : message, tb.toString());
    }
}
