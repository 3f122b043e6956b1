"""One device of the Redis sync test: appends messages with random delays
while a RedisSync loop runs beside it; prints each acknowledged msg_id
(flushed) so the test knows what was acknowledged before a SIGKILL."""
import random
import sys
import threading
import time

from rune_fast.conversation_state import ConversationStateRepository
from rune_fast.records import ConversationMessageRecord
from rune_fast.redis_sync import RedisSync

state, url, name, count, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
repo = ConversationStateRepository(state, durability="fsync")
sync = RedisSync(repo, url, batch=int(sys.argv[6]) if len(sys.argv) > 6 else 500)
stop = threading.Event()
loop = threading.Thread(target=sync.run, args=(stop,), kwargs={"interval": 0.05}, daemon=True)
loop.start()
for i in range(count):
    time.sleep(rng.random() * 0.01)
    m = ConversationMessageRecord(msg_id=f"{name}-{i:05d}", channel_id=f"ch{rng.randrange(3)}",
                                  content=f"{name} says {i} Grüße", role=rng.choice(("user", "assistant")))
    repo.append(m)
    print(m.msg_id, flush=True)
stop.set()
loop.join()
repo.close()
print("done", flush=True)
