"""The questions, texts and voices the benchmarks, the soak test and the tests ask with, defined once.

Each list keeps the content its benchmark was measured with, so numbers stay comparable with
the results in docs/results/. A benchmark that needs a new question adds it here.
"""

from __future__ import annotations

# espeak-ng voices and speeds (words per minute) the spoken questions rotate through.
VOICES: list[tuple[str, int]] = [
    ("en-us", 160),
    ("en-us+f3", 175),
    ("en-gb", 150),
    ("en-us+m3", 185),
    ("en-gb+f2", 165),
]
# Voices of the ~2 minute numbered-sentence monologue (bench.long_speech).
LONG_VOICES: list[tuple[str, int]] = [("en-us", 160), ("en-gb+f3", 175), ("en-us+m3", 145)]

# The held-out spoken questions of the voice benchmark (bench.voice): never used to tune anything.
HELD_OUT: list[str] = [
    "Tell me a fun fact about cats.",
    "What color is the sky?",
    "Name a big city in Japan.",
    "Give me a tip for sleeping better.",
    "What is the largest ocean?",
    "What language is spoken in Spain?",
    "Suggest a name for a dog.",
    "What is water made of?",
    "How do I boil an egg?",
    "What is the opposite of hot?",
    "Tell me something about the moon.",
    "What is a good breakfast?",
    "What do you call a baby cat?",
    "How tall is Mount Everest?",
    "Say hello in French.",
]
# Questions with a pause in the middle: first half, second half, a word of the second half the
# transcript must have (a premature cut-off loses it).
PAUSED: list[tuple[str, str, str]] = [
    ("I would like to know", "how many days are in a week?", "week"),
    ("Can you tell me", "what the capital of France is?", "france"),
    ("I was wondering", "which planet is closest to the sun?", "planet"),
    ("Do you know", "who wrote Romeo and Juliet?", "romeo"),
    ("Please tell me", "what bees make.", "bees"),
]

# Short spoken questions for the ASR benchmarks (bench.asr_window, bench.long_speech).
SHORT_QUESTIONS: list[str] = [
    "What is the capital of France?",
    "Give me a tip for sleeping better.",
    "Which planet is closest to the sun?",
    "I would like to know how many days are in a week.",
    "Tell me a fun fact about cats.",
    "Who wrote Romeo and Juliet?",
    "How do I boil an egg?",
    "What is the opposite of hot?",
    "Suggest a name for a dog.",
    "What language is spoken in Spain?",
    "Set a timer for ten minutes.",
    "Play some relaxing music please.",
]

# The ASR accuracy corpus (bench.asr_window): short utterances with their texts, spoken at bench
# time in ASR_VOICES (audio is never committed). Numbers, names, commands and questions; the
# paused ones are PAUSED plus ASR_PAUSED, spoken with a silence between their halves.
ASR_VOICES: list[tuple[str, int]] = [
    *VOICES,
    ("en-gb-scotland", 140),
    ("en-us+m7", 200),
    ("piper:en_US-joe-medium", 160),  # only with --piper-python (bench.speech.PIPER)
]
ASR_EXTRA: list[str] = [
    "Set an alarm for six thirty tomorrow morning.",
    "What is 25 times 4?",
    "Call my sister Emma.",
    "How far is it from London to Paris?",
    "Remind me to call David at 3 o'clock.",
    "What year did the Second World War end?",
    "Add milk, eggs and bread to my shopping list.",
    "Is it going to rain in Seattle tomorrow?",
    "Who painted the Mona Lisa?",
    "Convert 100 dollars to euros.",
    "How many ounces are in a pound?",
    "Send a message to Michael saying I will be late.",
    "What is the square root of 81?",
    "Turn the volume down to 20 percent.",
    "When was Abraham Lincoln born?",
    "What time is it in Tokyo right now?",
    "Read me the latest news about football.",
    "How long does it take to bake a potato?",
    "Book a table for 4 people at 7 tonight.",
    "Spell the word necessary.",
    "What is the population of Canada?",
    "Where is the nearest pharmacy?",
    "Tell me a joke about penguins.",
    "What did Albert Einstein discover?",
    "Play the next song.",
    "How do you say thank you in German?",
    "What is 15 percent of 200?",
    "Pause the music for a moment.",
    "Who is the author of Harry Potter?",
    "How many players are on a soccer team?",
    "What is the boiling point of water?",
    "Start a timer for 45 seconds.",
    "What is the tallest building in the world?",
    "Please turn on the living room lights.",
    "How old is the universe?",
    "My phone number is 555 0199.",
    "Schedule a meeting with Sarah on Friday.",
    "What is the distance to the moon in miles?",
    "Which river flows through Egypt?",
    "Give me a recipe for pancakes.",
    "Can you recommend a movie for tonight?",
    "What is the weather like in Berlin?",
    "Translate good morning into Spanish.",
    "How many calories are in an apple?",
    "Who was the first person on the moon?",
    "Open the garage door.",
    "What is the speed of sound?",
    "Count backwards from 10.",
    "Tell me about Marie Curie.",
    "How do I reset my password?",
    "What is the capital of Australia?",
    "How many minutes are in 3 hours?",
    "Find a coffee shop near Central Park.",
    "What is 7 plus 8?",
    "Lock the front door please.",
    "When does the library open on Sunday?",
    "Who composed the Moonlight Sonata?",
    "How deep is the Pacific Ocean?",
    "Set the thermostat to 21 degrees.",
    "What are the symptoms of the flu?",
    "How do I get to the train station?",
    "Tell me a story about a dragon.",
    "What is the largest animal on earth?",
    "Email the report to Jennifer.",
    "How many bones are in the human body?",
    "What is my next appointment?",
    "Why do leaves change color in autumn?",
    "Order a large pizza with mushrooms.",
    "How tall is the Eiffel Tower?",
    "What is the longest river in South America?",
    "Skip this track.",
    "How many teaspoons are in a tablespoon?",
    "What does a carpenter do?",
    "Wake me up at 5 in the morning.",
]
# More questions with a pause in the middle (first half, second half, a word of the second half).
ASR_PAUSED: list[tuple[str, str, str]] = [
    ("Could you tell me", "how old Queen Victoria was?", "victoria"),
    ("I need to know", "what 12 times 12 is.", "twelve"),
    ("Hey, um,", "what time does the bank close?", "bank"),
    ("Remind me", "to buy flowers for Olivia.", "olivia"),
    ("So the question is,", "how big is Jupiter?", "jupiter"),
    ("Tell me", "where Mount Kilimanjaro is.", "kilimanjaro"),
    ("What do you think", "about learning to play the piano?", "piano"),
]


def asr_corpus() -> list[str | tuple[str, str]]:
    """The ASR corpus: whole utterances, then ``(first half, second half)`` of the paused ones."""
    whole = list(dict.fromkeys([*SHORT_QUESTIONS, *HELD_OUT, *ASR_EXTRA]))  # in order, no repeats
    return [*whole, *((first, rest) for first, rest, _ in [*PAUSED, *ASR_PAUSED])]


# The soak test's questions (bench.soak): typed ones, and spoken ones played into the microphone.
SOAK_TYPED: list[str] = [
    "What is the capital of France?",
    "Name a color.",
    "Give me a word that rhymes with cat.",
    "What do bees make?",
    "Say something about the sea.",
    "How many legs does a spider have?",
    "Suggest a name for a dog.",
    "What is the opposite of cold?",
]
SOAK_SPOKEN: list[str] = [
    "What is the capital of Italy?",
    "Tell me a fun fact about cats.",
    "What color is the sky?",
    "Name a big city in Japan.",
    "What is the largest ocean?",
    "How do I boil an egg?",
]

# Typed questions with long answers, for the first spoken chunk (bench.first_chunk).
OPEN_QUESTIONS: list[str] = [
    "Tell me about the history of Rome.",
    "How do I make a cup of tea?",
    "What is the capital of France?",
    "Can you explain how a rainbow forms?",
    "What should I cook for dinner tonight?",
    "Why is the sky blue?",
    "Give me some tips for sleeping better.",
    "What's the weather usually like in London in spring?",
    "How does a car engine work?",
    "Can you recommend a good book to read?",
    "What are the benefits of drinking water?",
    "How far away is the moon?",
]
WARM_UP = "Hello, who are you?"
# A reply whose echo a word is said over, offline (bench.stop_closed_loop and
# tests/integration/test_stop_over_the_echo.py).
ECHO_REPLY = "Paris has been a centre of learning and the arts for centuries, and its history is long."

# Typed questions for the UI overhead benchmark (bench.ui).
UI_QUESTIONS: list[str] = [
    "What is the capital of France?",
    "Say hello.",
    "Name a colour.",
    "Count to three.",
]

# The decoder benchmark's two-turn conversation (bench.decoder): turn 2 is the timed one.
TURN1, TURN2 = "What is the capital of France?", "And what is it famous for?"

# Typed questions for the app's metrics and records (tests of --metrics-port and docs/monitoring/).
TYPED_PAIR: tuple[str, str] = ("What is the capital of France?", "Name a color.")

# One question per session of the in-flight batching tests and the serve benchmark's sessions.
BATCH_QUESTIONS: list[str] = [
    "What is the capital of France?",
    "Name three colours.",
    "How many days are in a week?",
    "Tell me a joke.",
    "What is two plus two?",
    "Who wrote Hamlet?",
    "What is the speed of light?",
    "Say hello in Spanish.",
]

# What the TTS benchmark speaks (bench.tts): pieces as the splitter hands them over (first chunks,
# sentences, a two-sentence piece).
REPLY_PIECES: list[str] = [
    "The capital of France is Paris.",
    "Sure, here is a fun fact:",
    "Cats sleep for about sixteen hours a day.",
    "The sky looks blue because",
    "air scatters blue sunlight more than red.",
    "Tokyo is the biggest city in Japan, with over thirteen million people.",
    "Try to go to bed at the same time every night.",
    "The largest ocean is the Pacific.",
    "Water is made of hydrogen and oxygen.",
    "Hello! How can I help you today?",
    "Boil the egg for about nine minutes, then cool it in cold water.",
    "Mount Everest is about 8,849 meters tall.",
]

# Raw prompts (no chat template) for decoder parity checks against transformers and ONNX Runtime.
PARITY_PROMPTS: list[str] = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n",
]
