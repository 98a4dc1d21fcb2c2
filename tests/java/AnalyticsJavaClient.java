// Segment's Java library (analytics-java, pinned by tests/java/pom.xml) against `dedupe ingest`,
// run by tests/ingest/servers.rs as a single source file:
//
//   java -cp "$(cat "$(tests/java/install.sh)")" tests/java/AnalyticsJavaClient.java
//
// INGEST_URL is the tracking API (the library posts to INGEST_URL + "/v1/import/"), WRITE_KEY the
// write key. It enqueues 25 messages of every type, ten per batch, as an application would. The
// first answer the API gives with 200 is dropped on its way back (an OkHttp interceptor closes it
// and fails the call, as a lost connection would), so the library sends that batch again, with
// the same messageIds, after its own back-off. Prints one JSON line: every request (path, status,
// whether its answer was dropped, its messageIds), the ids the library reported delivered and the
// failures it reported.

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import com.segment.analytics.Analytics;
import com.segment.analytics.Callback;
import com.segment.analytics.messages.AliasMessage;
import com.segment.analytics.messages.GroupMessage;
import com.segment.analytics.messages.IdentifyMessage;
import com.segment.analytics.messages.Message;
import com.segment.analytics.messages.PageMessage;
import com.segment.analytics.messages.ScreenMessage;
import com.segment.analytics.messages.TrackMessage;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import okhttp3.OkHttpClient;
import okhttp3.Request;
import okhttp3.Response;
import okio.Buffer;

public class AnalyticsJavaClient {
  static final int MESSAGES = 25;

  public static void main(String[] args) throws Exception {
    String url = System.getenv("INGEST_URL");
    String writeKey = System.getenv("WRITE_KEY");
    List<Map<String, Object>> requests = Collections.synchronizedList(new ArrayList<>());
    AtomicBoolean dropNext = new AtomicBoolean(true);
    OkHttpClient http =
        new OkHttpClient.Builder()
            .addInterceptor(
                chain -> {
                  Request request = chain.request();
                  Map<String, Object> seen = new LinkedHashMap<>();
                  seen.put("path", request.url().encodedPath());
                  seen.put("ids", messageIds(request));
                  Response response = chain.proceed(request);
                  seen.put("status", response.code());
                  boolean drop = response.code() == 200 && dropNext.getAndSet(false);
                  seen.put("dropped", drop);
                  requests.add(seen);
                  if (drop) {
                    response.close();
                    throw new IOException("the answer was lost on its way back (dropped by the test)");
                  }
                  return response;
                })
            .build();

    List<String> delivered = Collections.synchronizedList(new ArrayList<>());
    List<String> failures = Collections.synchronizedList(new ArrayList<>());
    CountDownLatch answered = new CountDownLatch(MESSAGES);
    Analytics analytics =
        Analytics.builder(writeKey)
            .endpoint(url)
            .client(http)
            .flushQueueSize(10)
            .callback(
                new Callback() {
                  @Override
                  public void success(Message message) {
                    delivered.add(message.messageId());
                    answered.countDown();
                  }

                  @Override
                  public void failure(Message message, Throwable error) {
                    failures.add(message.messageId() + ": " + error);
                    answered.countDown();
                  }
                })
            .build();

    String user = "java-user";
    for (int i = 0; i < MESSAGES - 5; i++) {
      analytics.enqueue(TrackMessage.builder("Java Event").userId(user).properties(Map.of("n", i)));
    }
    analytics.enqueue(IdentifyMessage.builder().userId(user).traits(Map.of("plan", "pro")));
    analytics.enqueue(PageMessage.builder("Home").userId(user));
    analytics.enqueue(ScreenMessage.builder("Settings").userId(user));
    analytics.enqueue(GroupMessage.builder("group-1").userId(user));
    analytics.enqueue(AliasMessage.builder("java-user-before").userId(user));
    analytics.flush();
    // The library backs off 15 to 30 s before it sends the dropped batch again.
    boolean complete = answered.await(120, TimeUnit.SECONDS);
    analytics.shutdown();

    Map<String, Object> out = new LinkedHashMap<>();
    out.put("complete", complete);
    out.put("requests", new ArrayList<>(requests));
    out.put("delivered", new ArrayList<>(delivered));
    out.put("failures", new ArrayList<>(failures));
    System.out.println(new Gson().toJson(out));
    System.exit(0);
  }

  /** The messageIds of a batch request's body. */
  static List<String> messageIds(Request request) throws IOException {
    List<String> ids = new ArrayList<>();
    if (request.body() == null) {
      return ids;
    }
    Buffer body = new Buffer();
    request.body().writeTo(body);
    JsonElement batch = JsonParser.parseString(body.readUtf8()).getAsJsonObject().get("batch");
    if (batch != null) {
      batch.getAsJsonArray().forEach(m -> ids.add(m.getAsJsonObject().get("messageId").getAsString()));
    }
    return ids;
  }
}
