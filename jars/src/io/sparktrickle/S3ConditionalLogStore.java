package io.sparktrickle;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;

import io.delta.storage.S3SingleDriverLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta log store for S3 that is safe with several writing processes (issue 18): a new log entry is
 * written with S3's conditional write, {@code If-None-Match: *} (Hadoop 3.4.2's S3A option
 * {@code fs.option.create.conditional.overwrite}), so when two processes commit the same version S3 itself
 * lets exactly one through and the other gets Delta's usual {@link FileAlreadyExistsException}, retries
 * and checks for conflicts. Delta's default {@link S3SingleDriverLogStore} checks for the file and then
 * writes it, which is atomic only within one JVM. Everything else (reads, listing) is inherited.
 *
 * Use: {@code spark.delta.logStore.s3a.impl=io.sparktrickle.S3ConditionalLogStore}.
 */
public class S3ConditionalLogStore extends S3SingleDriverLogStore {
  public S3ConditionalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    if (overwrite) {
      super.write(path, actions, overwrite, hadoopConf);
      return;
    }
    FileSystem fs = path.getFileSystem(hadoopConf);
    try {
      FSDataOutputStream out = (FSDataOutputStream) fs.createFile(path).overwrite(false)
          .must("fs.option.create.conditional.overwrite", true).build();
      try {
        while (actions.hasNext()) {
          out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
      } finally {
        out.close(); // the PUT, with If-None-Match: *
      }
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      throw new FileAlreadyExistsException(path.toString());
    } catch (IOException e) {
      String m = String.valueOf(e.getMessage());
      if (e.getClass().getSimpleName().equals("RemoteFileChangedException") || m.contains("412")
          || m.contains("PreconditionFailed")) {
        throw new FileAlreadyExistsException(path.toString());
      }
      throw e;
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false; // an S3 object appears whole on close
  }
}
