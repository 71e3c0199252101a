Feature: Filesystem utilities shared by the directory sandboxes
  As a developer
  I want exact tree copies, rename-based restores and tree diffs
  So that copy-on-write and overlay sandboxes can snapshot, restore and review changes

  # --- backup_directory ---

  Scenario: backup_directory keeps symlinks as links, even loops and dangling ones
    Given a fsu tree with a symlink loop, a dangling link and a relative link
    When the fsu tree is backed up to "backup"
    Then the fsu backup "backup" should hold link "a/b/up" to "../.."
    And the fsu backup "backup" should hold link "dangling" to "/nonexistent/target"
    And the fsu backup "backup" should hold link "a/rel" to "b/f"
    And the fsu backup "backup" should have 2 directories

  Scenario: backup_directory preserves modes, timestamps and empty directories
    Given a fsu tree with an executable, an empty directory and an old timestamp
    When the fsu tree is backed up to "backup"
    Then the fsu backup "backup" should equal the tree exactly
    And the fsu backup "backup" path "run.sh" should have mode "755"
    And the fsu backup "backup" path "old.txt" should have mtime 1234567890123 ns

  Scenario: backup_directory refuses an existing destination
    Given a fsu tree with an executable, an empty directory and an old timestamp
    When the fsu tree is backed up to "src"
    Then a fsu FileExistsError should be raised

  # --- safe_restore ---

  Scenario: safe_restore puts the backup in place and leaves nothing beside it
    Given a fsu tree with an executable, an empty directory and an old timestamp
    When the fsu tree is backed up to "backup"
    And the fsu tree file "run.sh" is changed to "echo changed"
    And the fsu tree file "extra.txt" is changed to "extra"
    And the fsu backup "backup" is restored onto the tree
    Then the fsu tree should be exactly as initialised
    And the fsu backup "backup" should not exist
    And no fsu staging directory should be left beside the tree

  Scenario: safe_restore works from another filesystem
    Given a fsu tree with an executable, an empty directory and an old timestamp
    When the fsu tree is backed up to tmpfs
    And the fsu tree file "run.sh" is changed to "echo changed"
    And the fsu tmpfs backup is restored onto the tree
    Then the fsu tree should be exactly as initialised
    And no fsu staging directory should be left beside the tree

  # --- compute_diff ---

  Scenario: compute_diff shows a modified text file as a unified diff
    Given fsu trees where "notes.txt" goes from "one,two" to "one,TWO"
    When the fsu diff is computed
    Then the fsu diff should be
      """
      diff --git a/notes.txt b/notes.txt
      --- a/notes.txt
      +++ b/notes.txt
      @@ -1,2 +1,2 @@
       one
      -two
      +TWO
      """

  Scenario: compute_diff shows added and deleted files against /dev/null
    Given fsu trees where "gone.txt" is deleted and "new.txt" is added with "hello"
    When the fsu diff is computed
    Then the fsu diff should be
      """
      diff --git a/gone.txt b/gone.txt
      deleted file mode 100644
      --- a/gone.txt
      +++ /dev/null
      @@ -1 +0,0 @@
      -bye
      diff --git a/new.txt b/new.txt
      new file mode 100644
      --- /dev/null
      +++ b/new.txt
      @@ -0,0 +1 @@
      +hello
      """

  Scenario: compute_diff notes binary files
    Given fsu trees where binary file "blob.bin" changes
    When the fsu diff is computed
    Then the fsu diff should be
      """
      diff --git a/blob.bin b/blob.bin
      Binary files a/blob.bin and b/blob.bin differ
      """

  Scenario: compute_diff shows symlinks as their targets
    Given fsu trees where symlink "current" goes from "v1" to "v2"
    When the fsu diff is computed
    Then the fsu diff should be
      """
      diff --git a/current b/current
      --- a/current
      +++ b/current
      @@ -1 +1 @@
      -v1
      +v2
      """

  Scenario: compute_diff notes mode changes
    Given fsu trees where "run.sh" goes from mode "644" to mode "755"
    When the fsu diff is computed
    Then the fsu diff should be
      """
      diff --git a/run.sh b/run.sh
      old mode 100644
      new mode 100755
      """

  Scenario: compute_diff of equal trees is empty
    Given fsu trees where "notes.txt" goes from "same" to "same"
    When the fsu diff is computed
    Then the fsu diff should be empty

  # --- compute_changes and sync_tree ---

  Scenario: compute_changes reports type swaps as changes of the path
    Given fsu trees where directory "x" becomes a file and file "y" becomes a directory
    When the fsu changes are computed
    Then the fsu changes should be added "y/child.txt", changed "x,y", deleted "x/inner.txt"

  Scenario: sync_tree makes the target equal to the source with no leftovers
    Given fsu trees where directory "x" becomes a file and file "y" becomes a directory
    When the fsu original tree is synced from the modified tree
    Then the fsu original tree should equal the modified tree
    And no fsu staging directory should be left beside the original tree
