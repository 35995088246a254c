"""Layer 3: building and training one member. ``architecture`` turns a layer list or a
user's builder into a Keras model with the task's head; ``member`` trains it (alone or
data-parallel in a group), reports to the master when asked, and writes its artifacts
through the run directory. The only layer (with ``inference``) that imports TensorFlow.
"""
