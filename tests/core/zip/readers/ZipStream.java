import java.io.ByteArrayOutputStream;
import java.io.FileInputStream;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;

/**
 * Java's streaming zip reader (java.util.zip.ZipInputStream walks local headers one after
 * another, as jar tools and many JVM loaders do), for tests/core/zip/test_local_central_readers.py.
 * For each file argument prints "FILE", then per entry "ENTRY <name hex> <bytes hex>", or
 * "ERROR <message>" where the reader gives up; once with the default charset (UTF-8 for every
 * name) and once as legacy archives are read, with Cp437 (the UTF-8 flag of each local header
 * then decides), each pass after a "PASS <charset>" line.
 */
public class ZipStream {
    private static String hex(byte[] data) {
        StringBuilder out = new StringBuilder();
        for (byte b : data) {
            out.append(String.format("%02x", b));
        }
        return out.toString();
    }

    public static void main(String[] args) {
        for (Charset charset : new Charset[] {StandardCharsets.UTF_8, Charset.forName("Cp437")}) {
            System.out.println("PASS " + charset.name());
            for (String path : args) {
                read(path, charset);
            }
        }
    }

    private static void read(String path, Charset charset) {
        System.out.println("FILE");
        try (ZipInputStream in = new ZipInputStream(new FileInputStream(path), charset)) {
            ZipEntry entry;
            while ((entry = in.getNextEntry()) != null) {
                ByteArrayOutputStream buf = new ByteArrayOutputStream();
                byte[] chunk = new byte[8192];
                int n;
                while ((n = in.read(chunk)) > 0) {
                    buf.write(chunk, 0, n);
                }
                System.out.println("ENTRY " + hex(entry.getName().getBytes(StandardCharsets.UTF_8))
                                   + " " + hex(buf.toByteArray()));
            }
        } catch (Exception exc) {
            System.out.println("ERROR " + exc);
        }
    }
}
